"""Table ``pools``: warm-pool targets, one per snapshot tag. Written only by
``controller.pools.PoolKeeper``."""

from __future__ import annotations

import json

from forkd.host.egress import EgressPolicy
from forkd.store.records import PoolConfig, PoolKey
from forkd.store.rows.table import Table


class PoolRows(Table):
    def set(self, pool: PoolConfig) -> None:
        """Keep (or replace) the pool target of ``pool.tag``; one pool per tag."""
        k = pool.key
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO pools "
                "(tag, size, memory_limit_mib, per_child_netns, live_fork, egress) VALUES (?, ?, ?, ?, ?, ?)",
                (k.tag, pool.size, k.memory_limit_mib, int(k.per_child_netns), int(k.live_fork),
                 json.dumps(k.egress.info())))

    def delete(self, tag: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM pools WHERE tag = ?", (tag,))

    def all(self) -> list[PoolConfig]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM pools ORDER BY tag").fetchall()
        return [PoolConfig(PoolKey(r["tag"], r["memory_limit_mib"], bool(r["per_child_netns"]),
                                   bool(r["live_fork"]),
                                   EgressPolicy.from_info(json.loads(r["egress"] or "{}"))),
                           int(r["size"])) for r in rows]
