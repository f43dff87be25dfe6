"""What every table object shares: the registry's one SQLite connection and its lock."""

from __future__ import annotations

import sqlite3
import threading


class Table:
    """One table of the registry's database. Thread-safe: every statement runs under the
    database's lock (the daemon calls from the event loop and from worker threads)."""

    def __init__(self, db: sqlite3.Connection, lock: threading.RLock) -> None:
        self._db = db
        self._lock = lock
