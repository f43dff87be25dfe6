"""Table ``sandbox_aliases``: ids a promote (``replace_parent``) handed to another sandbox.
Written only by ``controller.forks.Forker``; the ``SandboxTable`` resolves through it."""

from __future__ import annotations

from typing import Protocol

from forkd.store.rows.table import Table

# Alias hops followed before giving up: promote(replace_parent) chains are short,
# and a loop (which promote never makes) must not hang a lookup.
MAX_ALIAS_HOPS = 32


class AliasReader(Protocol):
    """Aliases, read-only."""

    def resolve(self, sandbox_id: str) -> str: ...


class AliasRows(Table):
    def set(self, alias: str, target: str) -> None:
        """From now on ``alias`` names ``target`` (promote with replace_parent)."""
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO sandbox_aliases (alias, target) VALUES (?, ?)",
                             (alias, target))

    def resolve(self, sandbox_id: str) -> str:
        """The sandbox ``sandbox_id`` names now: itself, or where its aliases lead."""
        current = sandbox_id
        with self._lock:
            for _ in range(MAX_ALIAS_HOPS):
                row = self._db.execute("SELECT target FROM sandbox_aliases WHERE alias = ?",
                                       (current,)).fetchone()
                if row is None:
                    return current
                current = str(row[0])
        return current
