"""Persistent state: the SQLite registry and the on-disk layout of snapshots and sandboxes."""
