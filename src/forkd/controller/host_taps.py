"""Host tap devices: a tap serves one VM at a time.

A template or a child without a network namespace attaches its NIC to a tap in
the daemon's own namespace. This owner knows which taps are taken, by a live
sandbox (registry) or by a VM being started right now (claims).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from forkd.errors import Conflict, InvalidRequest
from forkd.host import netns as netns_mod
from forkd.store.registry import Registry


class HostTaps:
    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self._claimed: set[str] = set()

    def check_free(self, tap: str) -> None:
        """A tap in the daemon's own namespace, not attached to another VM of ours."""
        if not netns_mod.host_tap_exists(tap):
            raise InvalidRequest(netns_mod.missing_tap_message(tap))
        users = [sb.id for sb in self._registry.list_sandboxes() if sb.netns is None and sb.tap == tap]
        if users or tap in self._claimed:
            raise Conflict(
                f"tap device {tap} is already in use by {users[0] if users else 'another VM'}; "
                "a tap serves one VM at a time: fork with per_child_netns=true to give each "
                "child its own namespace with its own tap"
            )

    @contextmanager
    def claimed(self, tap: str | None) -> Iterator[None]:
        """Hold ``tap`` (checked free just before, with no await in between) while a VM starts."""
        if tap:
            self._claimed.add(tap)
        try:
            yield
        finally:
            if tap:
                self._claimed.discard(tap)
