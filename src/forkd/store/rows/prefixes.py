"""Table ``issued_prefixes``: every sandbox id prefix this data dir ever issued. Written only
by ``controller.sandboxes.SandboxTable`` (and by the registry's opening, for ids already
there)."""

from __future__ import annotations

from forkd.store.rows.table import Table


class PrefixRows(Table):
    def claim(self, prefix: str) -> bool:
        """Record ``prefix`` as issued; False if this data dir issued it before."""
        with self._lock:
            cur = self._db.execute("INSERT OR IGNORE INTO issued_prefixes (prefix) VALUES (?)", (prefix,))
            return cur.rowcount == 1
