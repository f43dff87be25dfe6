# GENERATED from src/forkd/sdk/async_snapshot.py by scripts/unasync_sdk.py — do not edit.
# Edit the async source, then run: python scripts/unasync_sdk.py
"""Object-style SDK: :class:`Snapshot`, a registered snapshot tag that sandboxes fork from.

::

    from forkd import Snapshot

    snap = Snapshot.from_tag("pyagent")
    kids = snap.fork(n=5)  # waits until it is ready, then spawns 5
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Unpack

from forkd.sdk._defaults import default_controller
from forkd.sdk._http import DEFAULT_WAIT_SECS, snapshot_is_ready
from forkd.sdk._generated.client import Controller
from forkd.sdk.models import NetworkPolicy, SpawnExtra
from forkd.sdk.types import SnapshotInfo, SnapshotView

if TYPE_CHECKING:
    from forkd.sdk._generated.sandbox import Sandbox


class Snapshot(SnapshotView):
    """A registered snapshot tag, as returned by :meth:`Sandbox.branch`.

    Behaves as its SnapshotInfo dict (``snap["tag"]``) and adds
    :meth:`wait_ready`, :meth:`fork` and :meth:`delete`.
    """

    def __init__(self, info: SnapshotInfo, *, controller: Controller | None = None) -> None:
        super().__init__(info)
        self.controller = controller or default_controller()

    @classmethod
    def from_tag(cls, tag: str, *, controller: Controller | None = None) -> Snapshot:
        """Look up an existing snapshot by tag."""
        controller = controller or default_controller()
        return cls(controller.get_snapshot(tag), controller=controller)

    @classmethod
    def create(
        cls, tag: str, *, controller: Controller | None = None, **kwargs: Any
    ) -> Snapshot:
        """Build a new snapshot; ``kwargs`` as for :meth:`Controller.create_snapshot`."""
        controller = controller or default_controller()
        return cls(controller.create_snapshot(tag, **kwargs), controller=controller)

    def refresh(self) -> Snapshot:
        """Re-read the SnapshotInfo from the daemon."""
        self._info = self.controller.get_snapshot(self.tag)
        return self

    def wait_ready(
        self, timeout: float | None = DEFAULT_WAIT_SECS, interval: float = 0.2
    ) -> Snapshot:
        """Wait until the snapshot can be forked (a live ``wait=False`` branch is
        still ``"writing"`` for a while). Returns immediately if it already is.

        Raises :class:`~forkd.sdk.errors.SnapshotFailedError` or
        :class:`~forkd.sdk.errors.ForkdTimeoutError`.
        """
        if not snapshot_is_ready(self._info):
            self._info = self.controller.wait_snapshot_ready(self.tag, timeout, interval)
        return self

    def fork(
        self,
        n: int = 1,
        *,
        per_child_netns: bool = False,
        memory_limit_mib: int | None = None,
        live_fork: bool = False,
        wait_timeout: float | None = DEFAULT_WAIT_SECS,
        env: Mapping[str, str] | None = None,
        child_env: Sequence[Mapping[str, str]] | None = None,
        metadata: Mapping[str, str] | None = None,
        timeout_secs: float | None = None,
        allow_internet_access: bool = False,
        network: NetworkPolicy | None = None,
        **options: Unpack[SpawnExtra],
    ) -> list[Sandbox]:
        """Spawn ``n`` sandboxes from this snapshot (after :meth:`wait_ready`).

        The sandboxes are owned by the caller: each is killed when used as a
        context manager and left, or explicitly via :meth:`Sandbox.kill`.
        ``env``, ``child_env`` (one per sandbox), ``metadata``,
        ``timeout_secs``, ``allow_internet_access``, ``network`` and ``**options``
        (the request's other fields) as for :meth:`Controller.spawn_sandboxes`.
        """
        self.wait_ready(wait_timeout)
        infos = self.controller.spawn_sandboxes(
            self.tag,
            n=n,
            per_child_netns=per_child_netns,
            memory_limit_mib=memory_limit_mib,
            live_fork=live_fork,
            env=env,
            child_env=child_env,
            metadata=metadata,
            timeout_secs=timeout_secs,
            allow_internet_access=allow_internet_access,
            network=network,
            **options,
        )
        # Imported here: a sandbox makes snapshots (branch) and a snapshot makes sandboxes (fork).
        from forkd.sdk._generated.sandbox import Sandbox

        return [Sandbox.from_info(info, self.controller) for info in infos]

    def delete(self, cascade: bool = False, force: bool = False) -> None:
        """Unregister the tag and remove its files."""
        self.controller.delete_snapshot(self.tag, cascade=cascade, force=force)


__all__ = ["Snapshot"]
