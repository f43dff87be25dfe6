"""The one set of snapshot tags being written right now.

Creating a snapshot, a BRANCH and the API's concurrency gate all ask here, so
two writers can never race for one tag, whichever door they came in by.
Checks and claims happen with no ``await`` in between: on one event loop they
are atomic without a lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from forkd.errors import Conflict
from forkd.store.layout import check_tag


class TagReservations:
    def __init__(self, exists: Callable[[str], bool]) -> None:
        self._exists = exists  # is the tag registered, or its directory on disk?
        self._in_flight: set[str] = set()

    def in_flight(self, tag: str) -> bool:
        return tag in self._in_flight

    def check_free(self, tag: str) -> None:
        """Raise 409 if ``tag`` is being written or already exists."""
        check_tag(tag)
        if tag in self._in_flight:
            raise Conflict(f"a snapshot with tag {tag!r} is already being written")
        if self._exists(tag):
            raise Conflict(f"snapshot {tag!r} already exists; delete it first (forkd rmi {tag})")

    def reserve(self, tag: str) -> None:
        self.check_free(tag)
        self._in_flight.add(tag)

    def release(self, tag: str) -> None:
        self._in_flight.discard(tag)

    @contextmanager
    def reserved(self, tag: str) -> Iterator[None]:
        self.reserve(tag)
        try:
            yield
        finally:
            self.release(tag)
