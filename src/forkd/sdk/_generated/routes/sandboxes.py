# GENERATED from src/forkd/sdk/async_routes/sandboxes.py by scripts/unasync_sdk.py — do not edit.
# Edit the async source, then run: python scripts/unasync_sdk.py
"""Sandbox routes: spawn, list, get, kill, timeout, ping, exec and eval."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Unpack, cast

from forkd.sdk import _calls
from forkd.sdk.models import (
    ApplyResponse,
    CancelEvalResponse,
    EvalResponse,
    ExecResponse,
    NetworkLog,
    NetworkPolicy,
    PingResponse,
    SandboxMemory,
    SpawnExtra,
)
from forkd.sdk.types import (
    SandboxInfo,
)

from .transport import Transport


class SandboxRoutes(Transport):
    """``/v1/sandboxes`` and a sandbox's one-shot calls."""

    # ---------------------------------------------------------------- sandboxes

    def spawn_sandboxes(
        self,
        tag: str,
        n: int = 1,
        per_child_netns: bool = False,
        memory_limit_mib: int | None = None,
        live_fork: bool = False,
        *,
        env: Mapping[str, str] | None = None,
        child_env: Sequence[Mapping[str, str]] | None = None,
        metadata: Mapping[str, str] | None = None,
        timeout_secs: float | None = None,
        idle_pause_secs: float | None = None,
        allow_internet_access: bool = False,
        network: NetworkPolicy | None = None,
        **options: Unpack[SpawnExtra],
    ) -> list[SandboxInfo]:
        """``POST /v1/sandboxes``: fork ``n`` children copy-on-write from snapshot ``tag``.

        Args:
            per_child_netns: put each child in its own ``forkd-child-<i>`` netns.
            memory_limit_mib: cgroup ``memory.max`` per child.
            live_fork: shmem-backed RAM so the child can later take
                ``mode="live"`` branches.
            env: environment every child gets right after its restore (in
                ``os.environ`` of the warm interpreter and in every exec).
            child_env: one environment per child (length ``n``), over ``env``.
            metadata: labels stored with every child, returned in its
                SandboxInfo and usable as a :meth:`list_sandboxes` filter.
            timeout_secs: each child is killed this many seconds after the
                spawn returns (its SandboxInfo has ``expires_at_unix``);
                :meth:`set_timeout` moves the deadline. Default: none.
            idle_pause_secs: pause each child once it has had no request for
                this many seconds (it then costs no CPU); its next request
                resumes it and steps its clock. SandboxInfo ``state`` says
                ``"running"`` or ``"paused"``. Default: never (a child with
                background work must not be paused).
            allow_internet_access: open the children's outbound traffic to the
                public internet (denied by default; needs a snapshot made with
                ``nic=True`` and IP forwarding on the host).
            network: finer egress, E2B's shape: ``{"allow_out": ["10.0.0.0/8",
                "192.0.2.7:443"], "deny_out": [...]}`` (IPv4 addresses or CIDRs,
                optionally ``:PORT`` or ``:FIRST-LAST``); allow wins over deny.
            **options: the request's other optional fields (``cpu_limit``,
                ``pids_limit``, ...: :class:`~forkd.sdk.models.SpawnExtra`, generated
                from the daemon's ``SpawnRequest``), sent as given.
        """
        call = _calls.spawn_sandboxes(
            tag,
            n=n,
            per_child_netns=per_child_netns,
            memory_limit_mib=memory_limit_mib,
            live_fork=live_fork,
            env=env,
            child_env=child_env,
            metadata=metadata,
            timeout_secs=timeout_secs,
            idle_pause_secs=idle_pause_secs,
            allow_internet_access=allow_internet_access,
            network=network,
            extra=options,
        )
        return cast(list[SandboxInfo], self._send(call))

    def list_sandboxes(
        self, snapshot_tag: str | None = None, metadata: Mapping[str, str] | None = None, *,
        state: str | None = None, limit: int | None = None, after: str | None = None,
    ) -> list[SandboxInfo]:
        """``GET /v1/sandboxes``: every live sandbox, or those matching the filters, oldest first.

        Args:
            snapshot_tag: only children of this snapshot.
            metadata: only sandboxes whose metadata has every one of these
                key/value pairs, e.g. ``{"fork_tree_id": tree_id}``.
            state: only sandboxes in this state (``running``, ``paused`` or ``hibernated``).
            limit: a page of at most this many (1 to 1000).
            after: the page after this sandbox id (the last id of the previous page).
        """
        call = _calls.list_sandboxes(snapshot_tag=snapshot_tag, metadata=metadata, state=state,
                                     limit=limit, after=after)
        return cast(list[SandboxInfo], self._send(call))

    def get_sandbox(self, sandbox_id: str) -> SandboxInfo:
        """``GET /v1/sandboxes/{id}``."""
        return cast(SandboxInfo, self._send(_calls.get_sandbox(sandbox_id)))

    def sandbox_diff(self, sandbox_id: str, against: str = "parent", *,
                           include: list[str] | None = None, exclude: list[str] | None = None,
                           format: str = "json") -> Any:
        """``GET /v1/sandboxes/{id}/diff``: what its filesystem changed since its snapshot
        (``against="parent"``), or against ``"snapshot:TAG"`` / ``"sandbox:ID"``. ``format``: ``json``
        (a :class:`SandboxDiff`: added, modified, deleted, with mode and owner changes), ``patch``
        (a unified diff, str) or ``tar`` (the changed files, bytes). ``include``/``exclude``: path
        prefixes or names (default exclusions: /proc, /sys, /tmp, caches, ...)."""
        return self._send(_calls.sandbox_diff(sandbox_id, against, include, exclude, format))

    def apply_changes(self, sandbox_id: str, source: str,
                            paths: list[str] | None = None) -> ApplyResponse:
        """``POST /v1/sandboxes/{id}/apply``: write ``source``'s changes since its snapshot (a child's,
        typically) into ``sandbox_id``. A path both changed differently raises
        :class:`~forkd.sdk.errors.Conflict` naming it, and nothing is written."""
        return cast(ApplyResponse, self._send(_calls.apply_changes(sandbox_id, source, paths)))

    def sandbox_memory(self, sandbox_id: str) -> SandboxMemory:
        """``GET /v1/sandboxes/{id}/memory``: what it costs the host, in bytes: RAM shared with its
        snapshot and siblings (``shared_bytes``), RAM of its own (``private_bytes``), pages not yet
        touched, and its own disk layers (``disk_bytes``). 409 while hibernated."""
        return cast(SandboxMemory, self._send(_calls.sandbox_memory(sandbox_id)))

    def network_log(self, sandbox_id: str) -> NetworkLog:
        """``GET /v1/sandboxes/{id}/network/log``: the latest names its guest asked its resolver
        for, each allowed (with the addresses opened) or refused, and why."""
        return cast(NetworkLog, self._send(_calls.network_log(sandbox_id)))

    def kill_sandbox(self, sandbox_id: str) -> None:
        """``DELETE /v1/sandboxes/{id}``: stop the VM. Snapshots branched from it survive."""
        self._send(_calls.kill_sandbox(sandbox_id))

    def hibernate(self, sandbox_id: str, *, memory: bool = True) -> SandboxInfo:
        """``POST /v1/sandboxes/{id}/hibernate``: its changed memory and device state to disk, its
        QEMU released; its next request of any kind wakes it (``state``: ``"hibernated"``).
        ``memory=False``: its disk alone is kept, and the wake cold-boots it (files survive,
        processes and memory do not)."""
        return cast(SandboxInfo, self._send(_calls.hibernate(sandbox_id, memory)))

    def set_timeout(self, sandbox_id: str, timeout_secs: float) -> SandboxInfo:
        """``POST /v1/sandboxes/{id}/timeout``: kill the sandbox ``timeout_secs`` from now.

        Sooner or later than its previous deadline, like E2B's ``set_timeout``.
        """
        return cast(SandboxInfo, self._send(_calls.set_timeout(sandbox_id, timeout_secs)))

    def update_network(self, sandbox_id: str, *, allow_internet_access: bool = False,
                             network: Mapping[str, Any] | None = None) -> SandboxInfo:
        """``PUT /v1/sandboxes/{id}/network``: replace the sandbox's network policy while it runs.

        The same fields as a spawn's ``allow_internet_access`` and ``network``
        (``allow_out``, ``deny_out``, ``allow_public_traffic``, ``mask_request_host``);
        what is omitted takes a spawn's default. A hibernated sandbox gets it at its wake.
        """
        return cast(SandboxInfo, self._send(_calls.update_network(
            sandbox_id, allow_internet_access=allow_internet_access, network=network)))

    def ping(self, sandbox_id: str) -> PingResponse:
        """``POST /v1/sandboxes/{id}/ping`` → ``{"pong": true, "pid": 1, ...}``."""
        return cast(PingResponse, self._send(_calls.ping(sandbox_id)))

    def exec(
        self,
        sandbox_id: str,
        args: str | Sequence[str],
        timeout_secs: float = 30,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | None = None,
        user: str | None = None,
    ) -> ExecResponse:
        """``POST /v1/sandboxes/{id}/exec``: run a subprocess in the guest.

        ``args`` is an argv list; a plain string is run via ``/bin/sh -c``.
        Returns ``{"stdout", "stderr", "exit_code", "error", "timed_out", ...}``;
        a failing command is not an exception. ``user``: a guest user to run as
        (``"user"``: uid 1000, home ``/home/user``); None: root.
        """
        call = _calls.exec_(
            sandbox_id, args, timeout_secs=timeout_secs, env=env, cwd=cwd, stdin=stdin, user=user
        )
        return cast(ExecResponse, self._send(call))

    def eval(self, sandbox_id: str, code: str, timeout: float | None = None) -> EvalResponse:
        """``POST /v1/sandboxes/{id}/eval``: evaluate ``code`` in the warm PID 1 interpreter.

        Returns ``{"result", "error", "exit_code"}``. One eval runs for at most
        ``timeout`` seconds (default: the daemon's, 60 s): the guest then
        interrupts the evaluated code (code blocked in a C call only once it
        returns to Python) and the reply says ``"TimeoutError: eval exceeded
        60 s"`` with ``exit_code`` 1; the next eval runs normally.
        :meth:`cancel_eval` interrupts it sooner.
        """
        return cast(EvalResponse, self._send(_calls.eval_(sandbox_id, code, timeout=timeout)))

    def cancel_eval(self, sandbox_id: str) -> CancelEvalResponse:
        """``POST /v1/sandboxes/{id}/eval/cancel``: interrupt the running eval → ``{"cancelled": bool}``.

        The eval answers ``"CancelledError: eval cancelled"``; ``cancelled`` is
        False when none was running.
        """
        return cast(CancelEvalResponse, self._send(_calls.cancel_eval(sandbox_id)))
