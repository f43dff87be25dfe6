# GENERATED from src/forkd/sdk/async_client.py by scripts/unasync_sdk.py — do not edit.
# Edit the async source, then run: python scripts/unasync_sdk.py
"""The REST client: :class:`Controller`, one method per route of the daemon's API (v1)."""

from __future__ import annotations

import collections.abc
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import IO, Any, Unpack, cast

import httpx

from forkd.sdk import _calls, _guest_calls
from forkd.sdk._http import (
    DEFAULT_TIMEOUT,
    DEFAULT_WAIT_SECS,
    Call,
    headers,
    parse_response,
    resolve_token,
    resolve_url,
    resolve_verify,
    snapshot_is_ready,
    stream_event,
    timeout_for,
    translate,
)
from forkd.sdk.errors import ForkdTimeoutError, NotFoundError
from forkd.sdk.models import (
    BranchExtra,
    CancelEvalResponse,
    CreateSnapshotExtra,
    EvalResponse,
    ExecResponse,
    FileInfo,
    FileList,
    ForkExtra,
    Health,
    MkdirResponse,
    PingResponse,
    PoolExtra,
    PoolInfo,
    PullResult,
    PushResult,
    SignalResponse,
    SnapshotDetail,
    SpawnExtra,
    StdinResponse,
    Version,
)
from forkd.sdk.types import (
    CheckpointInfo,
    ForkInfo,
    JSONDict,
    ProcessInfo,
    PromoteInfo,
    SandboxInfo,
    SnapshotInfo,
    WorkspaceInfo,
)

# Bytes read from a file object per piece of an upload.
UPLOAD_PIECE = 1 << 20
# Called with the bytes moved so far during an upload or a download.
Progress = Callable[[int], None]


class Controller:
    """Talks to a forkd daemon over its REST API (v1).

    Every method returns the daemon's JSON as plain ``dict``/``list``, typed with the
    ``TypedDict``s that scripts/gen_sdk_models.py generates from the daemon's OpenAPI
    document (:mod:`forkd.sdk.models`), and raises
    a :class:`~forkd.sdk.errors.ForkdAPIError` subclass on an error status, or
    :class:`~forkd.sdk.errors.ForkdConnectionError` if the daemon is not running.

    Args:
        url: daemon address; default ``$FORKD_URL``, else ``http://127.0.0.1:8889``.
        token: bearer token; default ``$FORKD_TOKEN``, else the contents of
            ``$FORKD_TOKEN_FILE``, else none (a daemon without ``--token-file``).
        timeout: seconds for ordinary requests. Snapshot builds, spawns,
            branches and evals wait without a read timeout, and exec waits for
            the command's own timeout plus a grace period.
        verify: TLS verification: ``True``, ``False``, an ``ssl.SSLContext`` or
            the path of a CA certificate (for a daemon serving a self-signed
            ``--tls-cert``); default ``$FORKD_CA_CERT`` if set, else system roots.
        transport: a custom httpx transport (tests use ``httpx.MockTransport``).

    Use it as a context manager, or call :meth:`close`, to release its
    connections.

    Example::

        from forkd import Controller

        with Controller() as c:
            [parent] = c.spawn_sandboxes("pyagent", n=1, live_fork=True)
            branch = c.branch_sandbox(parent["id"], tag="checkpoint", mode="diff")
            kids = c.spawn_sandboxes(branch["tag"], n=5)
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        *,
        verify: bool | str | ssl.SSLContext | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = resolve_url(url)
        self.timeout = timeout
        self._client = httpx.Client(
            base_url=self.url,
            headers=headers(resolve_token(token)),
            timeout=timeout,
            verify=resolve_verify(verify),
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"Controller(url={self.url!r})"

    # ----------------------------------------------------------------- plumbing

    def close(self) -> None:
        """Close the connection pool. The controller is unusable afterwards."""
        self._client.close()

    def __enter__(self) -> Controller:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _send(self, call: Call) -> Any:
        try:
            response = self._client.request(
                call.method,
                call.path,
                json=call.json,
                params=call.params or None,
                timeout=timeout_for(call, self.timeout),
            )
        except httpx.HTTPError as exc:
            raise translate(exc, self.url, call) from exc
        return parse_response(call, response)

    def _pieces(
        self, source: IO[bytes], progress: Progress | None
    ) -> collections.abc.Iterator[bytes]:
        """An upload body read from ``source`` a piece at a time, never whole."""
        done = 0
        while chunk := source.read(UPLOAD_PIECE):
            done += len(chunk)
            if progress is not None:
                progress(done)
            yield chunk

    # ------------------------------------------------------------------- status

    def healthz(self) -> Health:
        """``GET /healthz`` → ``{"ok": true}``. Needs no token."""
        return cast(Health, self._send(_calls.healthz()))

    def version(self) -> Version:
        """``GET /version`` → ``{"version": "0.1.0", "api": "v1"}``."""
        return cast(Version, self._send(_calls.version()))

    def metrics(self) -> str:
        """``GET /metrics``: Prometheus text exposition."""
        return cast(str, self._send(_calls.metrics()))

    # ---------------------------------------------------------------- snapshots

    def list_snapshots(self) -> list[SnapshotInfo]:
        """``GET /v1/snapshots``: every registered snapshot."""
        return cast(list[SnapshotInfo], self._send(_calls.list_snapshots()))

    def get_snapshot(self, tag: str) -> SnapshotDetail:
        """``GET /v1/snapshots/{tag}``: one snapshot, including its lineage."""
        return cast(SnapshotDetail, self._send(_calls.get_snapshot(tag)))

    def create_snapshot(
        self,
        tag: str,
        *,
        kernel: str | None = None,
        rootfs: str | None = None,
        boot_wait_secs: float | None = None,
        image: str | None = None,
        mem_mib: int | None = None,
        vcpus: int | None = None,
        warm_imports: Sequence[str] | None = None,
        setup: Sequence[str | Sequence[str]] | None = None,
        nic: bool = False,
        allow_internet_access: bool = False,
        network: Mapping[str, Sequence[str]] | None = None,
        **extra: Unpack[CreateSnapshotExtra],
    ) -> SnapshotInfo:
        """``POST /v1/snapshots``: boot a template VM, warm it up, snapshot it as ``tag``.

        Returns once the snapshot is ready (tens of seconds under TCG). Only the
        arguments you set are sent; the daemon picks defaults for the rest.

        Args:
            image: guest image name (``forkd image build --name``).
            warm_imports: Python modules PID 1 imports before the snapshot,
                e.g. ``["numpy", "json"]``.
            setup: commands run in the guest, in order, before the snapshot: a
                string runs via ``/bin/sh -c`` (``"pip install requests"``), a
                list is an argv.
            nic: give the template, and so every child, a network device (eth0
                with an address, a route and DNS); children are then reachable
                from the host at their SandboxInfo ``ip``.
            allow_internet_access, network: the template's own egress while it
                boots and runs ``setup`` (as for :meth:`spawn_sandboxes`).
            **extra: the request's other optional fields (:class:`~forkd.sdk.models.CreateSnapshotExtra`,
                generated from the daemon's ``CreateSnapshotRequest``), sent as given.
        """
        call = _calls.create_snapshot(
            tag,
            kernel=kernel,
            rootfs=rootfs,
            boot_wait_secs=boot_wait_secs,
            image=image,
            mem_mib=mem_mib,
            vcpus=vcpus,
            warm_imports=warm_imports,
            setup=setup,
            extra=extra,
            nic=nic,
            allow_internet_access=allow_internet_access,
            network=network,
        )
        return cast(SnapshotInfo, self._send(call))

    def delete_snapshot(self, tag: str, cascade: bool = False, force: bool = False) -> None:
        """``DELETE /v1/snapshots/{tag}``.

        Args:
            cascade: also delete snapshots branched from this one.
            force: delete even if live sandboxes were forked from it.
        """
        self._send(_calls.delete_snapshot(tag, cascade=cascade, force=force))

    def wait_snapshot_ready(
        self, tag: str, timeout: float | None = DEFAULT_WAIT_SECS, interval: float = 0.2
    ) -> SnapshotInfo:
        """Poll ``GET /v1/snapshots/{tag}`` until its ``status`` is ``"ready"``.

        Returns the final SnapshotInfo. Raises
        :class:`~forkd.sdk.errors.SnapshotFailedError` if the background write
        failed and :class:`~forkd.sdk.errors.ForkdTimeoutError` after ``timeout``
        seconds (``None`` waits forever).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            info = self.get_snapshot(tag)
            if snapshot_is_ready(info):
                return info
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ForkdTimeoutError(
                        f"snapshot {tag!r} is still {info.get('status')!r} after {timeout}s"
                    )
                time.sleep(min(interval, remaining))
            else:
                time.sleep(interval)

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
        network: Mapping[str, Sequence[str]] | None = None,
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
        self, snapshot_tag: str | None = None, metadata: Mapping[str, str] | None = None
    ) -> list[SandboxInfo]:
        """``GET /v1/sandboxes``: every live sandbox, or those matching the filters.

        Args:
            snapshot_tag: only children of this snapshot.
            metadata: only sandboxes whose metadata has every one of these
                key/value pairs, e.g. ``{"fork_tree_id": tree_id}``.
        """
        call = _calls.list_sandboxes(snapshot_tag=snapshot_tag, metadata=metadata)
        return cast(list[SandboxInfo], self._send(call))

    def get_sandbox(self, sandbox_id: str) -> SandboxInfo:
        """``GET /v1/sandboxes/{id}``."""
        return cast(SandboxInfo, self._send(_calls.get_sandbox(sandbox_id)))

    def kill_sandbox(self, sandbox_id: str) -> None:
        """``DELETE /v1/sandboxes/{id}``: stop the VM. Snapshots branched from it survive."""
        self._send(_calls.kill_sandbox(sandbox_id))

    def hibernate(self, sandbox_id: str) -> SandboxInfo:
        """``POST /v1/sandboxes/{id}/hibernate``: its changed memory and device state to disk, its
        QEMU released; its next request of any kind wakes it (``state``: ``"hibernated"``)."""
        return cast(SandboxInfo, self._send(_calls.hibernate(sandbox_id)))

    def set_timeout(self, sandbox_id: str, timeout_secs: float) -> SandboxInfo:
        """``POST /v1/sandboxes/{id}/timeout``: kill the sandbox ``timeout_secs`` from now.

        Sooner or later than its previous deadline, like E2B's ``set_timeout``.
        """
        return cast(SandboxInfo, self._send(_calls.set_timeout(sandbox_id, timeout_secs)))

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

    # ---------------------------------------------------------------- processes

    def _stream(self, call: Call) -> collections.abc.Generator[JSONDict, None, None]:
        """An NDJSON response, one event at a time, as the daemon writes them.

        An ``{"type": "error"}`` line (the stream broke after it had begun)
        raises :class:`~forkd.sdk.errors.ServerError`.
        """
        try:
            with self._client.stream(
                call.method, call.path, json=call.json, params=call.params or None,
                timeout=timeout_for(call, self.timeout),
            ) as response:
                if not response.is_success:
                    response.read()
                    parse_response(call, response)  # raises the mapped error
                for line in response.iter_lines():
                    if line.strip():
                        yield stream_event(call, line)
        except httpx.HTTPError as exc:
            raise translate(exc, self.url, call) from exc

    def exec_stream(
        self,
        sandbox_id: str,
        args: str | Sequence[str],
        timeout_secs: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | None = None,
        *,
        stdin_open: bool = False,
        tag: str | None = None,
        encoding: str = "text",
        user: str | None = None,
    ) -> collections.abc.Generator[JSONDict, None, None]:
        """``POST /v1/sandboxes/{id}/exec/stream``: run a command and stream its events.

        Yields ``{"type": "start", "pid"}``, then ``{"type": "stdout"|"stderr",
        "data"}`` as the command writes (``data`` is text, or base64 with
        ``encoding="base64"``), and last ``{"type": "exit", "exit_code",
        "signal", "timed_out", "error"}``. Leaving the iteration early (close
        it: ``contextlib.closing``) kills the command. With ``stdin_open``,
        write to it with :meth:`send_stdin` (the pid is in the start event).
        ``user``: a guest user to run as; None: root.
        """
        return self._stream(_guest_calls.exec_stream(
            sandbox_id, args, timeout_secs=timeout_secs, env=env, cwd=cwd, stdin=stdin,
            stdin_open=stdin_open, tag=tag, encoding=encoding, user=user))

    def start_process(
        self,
        sandbox_id: str,
        args: str | Sequence[str],
        timeout_secs: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | None = None,
        *,
        stdin_open: bool = False,
        tag: str | None = None,
        user: str | None = None,
    ) -> ProcessInfo:
        """``POST /v1/sandboxes/{id}/processes``: start a background process → its ProcessInfo.

        It runs until it exits, is killed, or ``timeout_secs`` pass (default:
        no limit), as ``user`` (None: root). Watch it with :meth:`stream_process`.
        """
        call = _guest_calls.start_process(sandbox_id, args, timeout_secs=timeout_secs, env=env, cwd=cwd,
                                    stdin=stdin, stdin_open=stdin_open, tag=tag, user=user)
        return cast(ProcessInfo, self._send(call))

    def list_processes(self, sandbox_id: str) -> list[ProcessInfo]:
        """``GET /v1/sandboxes/{id}/processes``: the running processes forkd started there."""
        return cast(list[ProcessInfo], self._send(_guest_calls.list_processes(sandbox_id)))

    def get_process(self, sandbox_id: str, pid: int) -> ProcessInfo:
        """``GET /v1/sandboxes/{id}/processes/{pid}``: running or recently exited."""
        return cast(ProcessInfo, self._send(_guest_calls.get_process(sandbox_id, pid)))

    def stream_process(
        self, sandbox_id: str, pid: int, from_start: bool = True, encoding: str = "text"
    ) -> collections.abc.Generator[JSONDict, None, None]:
        """``GET /v1/sandboxes/{id}/processes/{pid}/stream``: a process's events, as for
        :meth:`exec_stream`; from the oldest output the guest still keeps (up to
        1 MiB, ``from_start``) or from now. A ``{"type": "dropped", "bytes"}``
        event says output was lost before it could be sent. Leaving the
        iteration leaves the process running."""
        return self._stream(_guest_calls.stream_process(sandbox_id, pid, from_start=from_start,
                                                  encoding=encoding))

    def send_stdin(
        self, sandbox_id: str, pid: int, data: str | bytes, eof: bool = False
    ) -> StdinResponse:
        """``POST /v1/sandboxes/{id}/processes/{pid}/stdin``: write ``data`` (and close with ``eof``)."""
        return cast(StdinResponse, self._send(_guest_calls.send_stdin(sandbox_id, pid, data, eof=eof)))

    def close_stdin(self, sandbox_id: str, pid: int) -> StdinResponse:
        """Close a process's stdin (it reads end-of-file)."""
        return self.send_stdin(sandbox_id, pid, "", eof=True)

    def signal_process(
        self, sandbox_id: str, pid: int, signal: str | int = "SIGTERM", group: bool = True
    ) -> SignalResponse:
        """``POST /v1/sandboxes/{id}/processes/{pid}/signal``: ``SIGTERM``, ``"INT"``, ``9``, ..."""
        call = _guest_calls.signal_process(sandbox_id, pid, signal, group=group)
        return cast(SignalResponse, self._send(call))

    def kill_process(self, sandbox_id: str, pid: int) -> bool:
        """``DELETE /v1/sandboxes/{id}/processes/{pid}``: SIGKILL its group; False if it was not running."""
        try:
            self._send(_guest_calls.kill_process(sandbox_id, pid))
        except NotFoundError:
            return False
        return True

    # -------------------------------------------------------------------- files

    # Each file method takes ``user``: the guest user it acts as (permissions checked as theirs,
    # what it creates is theirs); None: root.

    def file_stat(self, sandbox_id: str, path: str, user: str | None = None) -> FileInfo:
        """``GET /v1/sandboxes/{id}/files/stat`` → ``{"path", "name", "type", "size", "mode", "mtime",
        "owner", "group"}``."""
        return cast(FileInfo, self._send(_guest_calls.file_stat(sandbox_id, path, user=user)))

    def file_list(self, sandbox_id: str, path: str, user: str | None = None) -> FileList:
        """``GET /v1/sandboxes/{id}/files/list`` → ``{"path", "entries": [FileInfo...], "truncated"}``."""
        return cast(FileList, self._send(_guest_calls.file_list(sandbox_id, path, user=user)))

    def file_mkdir(
        self, sandbox_id: str, path: str, parents: bool = False, user: str | None = None
    ) -> MkdirResponse:
        """``POST /v1/sandboxes/{id}/files/mkdir`` → ``{"path", "created"}``."""
        call = _guest_calls.file_mkdir(sandbox_id, path, parents=parents, user=user)
        return cast(MkdirResponse, self._send(call))

    def file_remove(
        self, sandbox_id: str, path: str, recursive: bool = False, user: str | None = None
    ) -> None:
        """``DELETE /v1/sandboxes/{id}/files``: a file, or a directory (``recursive`` if not empty)."""
        self._send(_guest_calls.file_remove(sandbox_id, path, recursive=recursive, user=user))

    def file_exists(self, sandbox_id: str, path: str, user: str | None = None) -> bool:
        """Whether ``path`` exists in the sandbox (for ``user``: whether they can see it)."""
        try:
            self.file_stat(sandbox_id, path, user=user)
        except NotFoundError:
            return False
        return True

    def write_file(
        self,
        sandbox_id: str,
        path: str,
        data: bytes | str | IO[bytes],
        mode: int | None = None,
        progress: Progress | None = None,
        user: str | None = None,
    ) -> FileInfo:
        """``PUT /v1/sandboxes/{id}/files``: write ``data`` to ``path``, replacing it atomically.

        ``data`` is bytes, text (UTF-8) or a binary file object, which is
        streamed a piece at a time, never read whole. Returns the FileInfo.
        """
        call = _guest_calls.file_write(sandbox_id, path, mode=mode, user=user)
        content: bytes | collections.abc.Iterator[bytes]
        if isinstance(data, str):
            content = data.encode()
        elif isinstance(data, bytes | bytearray | memoryview):
            content = bytes(data)
        else:
            content = self._pieces(data, progress)
        try:
            response = self._client.request(
                call.method, call.path, params=call.params, content=content,
                headers={"Content-Type": "application/octet-stream"},
                timeout=timeout_for(call, self.timeout),
            )
        except httpx.HTTPError as exc:
            raise translate(exc, self.url, call) from exc
        return cast(FileInfo, parse_response(call, response))

    def read_file_into(
        self, sandbox_id: str, path: str, sink: IO[bytes], progress: Progress | None = None,
        user: str | None = None,
    ) -> int:
        """``GET /v1/sandboxes/{id}/files``: stream ``path`` into ``sink``; returns the bytes written.

        An interrupted download raises (the body is chunked, so a cut is seen).
        """
        call = _guest_calls.file_read(sandbox_id, path, user=user)
        done = 0
        try:
            with self._client.stream(
                call.method, call.path, params=call.params, timeout=timeout_for(call, self.timeout)
            ) as response:
                if not response.is_success:
                    response.read()
                    parse_response(call, response)  # raises the mapped error
                for chunk in response.iter_bytes():
                    sink.write(chunk)
                    done += len(chunk)
                    if progress is not None:
                        progress(done)
        except httpx.HTTPError as exc:
            raise translate(exc, self.url, call) from exc
        return done

    def branch_sandbox(
        self,
        sandbox_id: str,
        tag: str | None = None,
        mode: str | None = None,
        wait: bool = True,
        diff: bool | None = None,
        **options: Unpack[BranchExtra],
    ) -> SnapshotInfo:
        """``POST /v1/sandboxes/{id}/branch``: snapshot a running sandbox as a new tag.

        The source pauses briefly and resumes; the new snapshot is independent
        of it. ``mode`` is ``"full"`` (daemon default), ``"diff"`` or ``"live"``
        (source spawned with ``live_fork=True``). ``wait=False`` (live only)
        returns with ``status: "writing"``; use :meth:`wait_snapshot_ready`.
        ``diff=True`` is the legacy spelling of ``mode="diff"``. ``**options`` are the
        request's other optional fields (:class:`~forkd.sdk.models.BranchExtra`, e.g.
        ``measure_diff``), sent as given.
        """
        call = _calls.branch_sandbox(sandbox_id, tag=tag, mode=mode, wait=wait, diff=diff, extra=options)
        return cast(SnapshotInfo, self._send(call))

    # ------------------------------------------------------ forking a running sandbox

    def fork_sandbox(
        self,
        sandbox_id: str,
        count: int = 1,
        *,
        per_child_netns: bool = False,
        memory_limit_mib: int | None = None,
        child_memory_limit_mib: Sequence[int | None] | None = None,
        live_fork: bool = False,
        env: Mapping[str, str] | None = None,
        child_env: Sequence[Mapping[str, str]] | None = None,
        metadata: Mapping[str, str] | None = None,
        keep_snapshot: bool = False,
        timeout_secs: float | None = None,
        allow_internet_access: bool = False,
        network: Mapping[str, Sequence[str]] | None = None,
        **options: Unpack[ForkExtra],
    ) -> ForkInfo:
        """``POST /v1/sandboxes/{id}/fork``: fork a running sandbox into ``count`` children.

        The source is branched once (``live`` if it was spawned with
        ``live_fork``, else ``diff``), keeps running, and each child is
        restored from that branch. Children succeed or fail one by one: the
        answer is ``{"parent_id", "snapshot_tag", "children": [SandboxInfo],
        "errors": [{"index", "error"}], "pause_ms"}``, and a failed child leaves
        nothing behind.

        Args:
            count: number of children.
            child_memory_limit_mib: one limit per child (``None`` entries use
                ``memory_limit_mib``).
            env, child_env, metadata, per_child_netns, memory_limit_mib,
                live_fork, allow_internet_access, network: as for
                :meth:`spawn_sandboxes` (the egress is the children's; the
                source keeps its own).
            keep_snapshot: keep the intermediate snapshot; by default it is
                deleted once its last child is gone.
            timeout_secs: each child is killed this many seconds after the
                fork returns (the source keeps its own deadline).
            **options: the request's other optional fields
                (:class:`~forkd.sdk.models.ForkExtra`, generated from the daemon's
                ``ForkRequest``), sent as given.
        """
        return cast(ForkInfo, self._send(_calls.fork_sandbox(
            sandbox_id,
            tree=False,
            count=count,
            per_child_netns=per_child_netns,
            memory_limit_mib=memory_limit_mib,
            child_memory_limit_mib=child_memory_limit_mib,
            live_fork=live_fork,
            env=env,
            child_env=child_env,
            metadata=metadata,
            keep_snapshot=keep_snapshot,
            timeout_secs=timeout_secs,
            allow_internet_access=allow_internet_access,
            network=network,
            extra=options,
        )))

    def fork_tree(
        self,
        sandbox_id: str,
        count: int = 1,
        *,
        per_child_netns: bool = False,
        memory_limit_mib: int | None = None,
        child_memory_limit_mib: Sequence[int | None] | None = None,
        live_fork: bool = False,
        env: Mapping[str, str] | None = None,
        child_env: Sequence[Mapping[str, str]] | None = None,
        metadata: Mapping[str, str] | None = None,
        keep_snapshot: bool = False,
        timeout_secs: float | None = None,
        allow_internet_access: bool = False,
        network: Mapping[str, Sequence[str]] | None = None,
        **options: Unpack[ForkExtra],
    ) -> ForkInfo:
        """``POST /v1/sandboxes/{id}/fork-tree``: :meth:`fork_sandbox`, as one fork-tree.

        The answer adds ``"tree_id"``; every child's metadata carries
        ``fork_tree_id``, ``fork_parent_id`` and ``fork_index``, so one of them
        can later be kept with :meth:`promote_sandbox`. ``metadata`` must not
        set those three keys itself.
        """
        return cast(ForkInfo, self._send(_calls.fork_sandbox(
            sandbox_id,
            tree=True,
            count=count,
            per_child_netns=per_child_netns,
            memory_limit_mib=memory_limit_mib,
            child_memory_limit_mib=child_memory_limit_mib,
            live_fork=live_fork,
            env=env,
            child_env=child_env,
            metadata=metadata,
            keep_snapshot=keep_snapshot,
            timeout_secs=timeout_secs,
            allow_internet_access=allow_internet_access,
            network=network,
            extra=options,
        )))

    def promote_sandbox(
        self,
        sandbox_id: str,
        *,
        tree_id: str | None = None,
        cleanup_siblings: bool = True,
        replace_parent: bool = False,
    ) -> PromoteInfo:
        """``POST /v1/sandboxes/{id}/promote``: keep this fork-tree child.

        Returns ``{"winner": SandboxInfo, "tree_id", "deleted": [{"id",
        "deleted", "error"?}], "replaced_parent"}``.

        Args:
            tree_id: the fork-tree; default: the child's own ``fork_tree_id``.
            cleanup_siblings: kill every other live child of the tree.
            replace_parent: also kill the tree's source; its id then names the
                winner in every endpoint (so killing the old id kills the winner).
        """
        call = _calls.promote_sandbox(
            sandbox_id,
            tree_id=tree_id,
            cleanup_siblings=cleanup_siblings,
            replace_parent=replace_parent,
        )
        return cast(PromoteInfo, self._send(call))

    def set_checkpoints(
        self, sandbox_id: str, every: int, keep: int | None = None, mode: str | None = None
    ) -> CheckpointInfo:
        """``POST /v1/sandboxes/{id}/checkpoints``: branch after every ``every`` exec/eval calls.

        Keeps the newest ``keep`` checkpoints (daemon default 3) and deletes
        older ones; ``mode`` is ``"diff"`` (default) or ``"live"`` (sandbox
        spawned with ``live_fork``). Replaces any earlier policy. Returns
        ``{"sandbox_id", "policy", "calls", "checkpoints": [SnapshotInfo],
        "last_error"?}``.
        """
        call = _calls.set_checkpoints(sandbox_id, every=every, keep=keep, mode=mode)
        return cast(CheckpointInfo, self._send(call))

    def get_checkpoints(self, sandbox_id: str) -> CheckpointInfo:
        """``GET /v1/sandboxes/{id}/checkpoints``: the policy and the kept checkpoints, oldest first."""
        return cast(CheckpointInfo, self._send(_calls.get_checkpoints(sandbox_id)))

    def delete_checkpoints(self, sandbox_id: str) -> CheckpointInfo:
        """``DELETE /v1/sandboxes/{id}/checkpoints``: stop the policy; the checkpoints taken stay."""
        return cast(CheckpointInfo, self._send(_calls.delete_checkpoints(sandbox_id)))


    def set_pool(
        self,
        tag: str,
        size: int,
        *,
        memory_limit_mib: int | None = None,
        per_child_netns: bool = False,
        live_fork: bool = False,
        allow_internet_access: bool = False,
        network: Mapping[str, Sequence[str]] | None = None,
        **options: Unpack[PoolExtra],
    ) -> PoolInfo:
        """``PUT /v1/snapshots/{tag}/pool``: keep ``size`` children restored and paused.

        Spawns of ``tag`` with the same options (``memory_limit_mib``,
        ``per_child_netns``, ``live_fork``, ``allow_internet_access``,
        ``network``) are served from the pool first;
        ``size=0`` drains it. Returns ``{"size", "ready", ...}``. ``**options`` are the
        request's other optional fields (:class:`~forkd.sdk.models.PoolExtra`), sent as given.
        """
        call = _calls.set_pool(
            tag,
            size,
            memory_limit_mib=memory_limit_mib,
            per_child_netns=per_child_netns,
            live_fork=live_fork,
            allow_internet_access=allow_internet_access,
            network=network,
            extra=options,
        )
        return cast(PoolInfo, self._send(call))

    def get_pool(self, tag: str) -> PoolInfo:
        """``GET /v1/snapshots/{tag}/pool`` → ``{"size", "ready", "claims", "misses", ...}``."""
        return cast(PoolInfo, self._send(_calls.get_pool(tag)))

    def list_pools(self) -> list[PoolInfo]:
        """``GET /v1/pools``: every warm pool of the daemon."""
        return cast(list[PoolInfo], self._send(_calls.list_pools()))

    def push_snapshot(self, tag: str, *, force: bool = False) -> PushResult:
        """``POST /v1/snapshots/{tag}/push``: publish it (and the chain its disk needs) to the object store.

        Content-addressed: only blobs the store lacks are sent. ``force`` replaces a
        different snapshot of the same tag there. Returns ``{"lineage", "blobs_uploaded", ...}``.
        """
        return cast(PushResult, self._send(_calls.push_snapshot(tag, force=force)))

    def pull_snapshot(self, tag: str) -> PullResult:
        """``POST /v1/snapshots/{tag}/pull``: fetch it from the object store onto the daemon's host.

        Ancestors the host already holds are reused. Returns ``{"created", "reused",
        "bytes_downloaded"}``. (A spawn of a tag the host lacks pulls it by itself.)
        """
        return cast(PullResult, self._send(_calls.pull_snapshot(tag)))

    def compact_snapshot(self, tag: str, to: str) -> SnapshotInfo:
        """``POST /v1/snapshots/{tag}/compact``: copy ``tag`` into ``to``, a standalone snapshot.

        Its disk chain is flattened and it has no parent, so ``tag``'s ancestors can
        then be deleted without losing ``to``.
        """
        return cast(SnapshotInfo, self._send(_calls.compact_snapshot(tag, to)))

    # -------------------------------------------------------------- workspaces

    def create_workspace(
        self,
        name: str,
        snapshot_tag: str,
        *,
        per_child_netns: bool = False,
        memory_limit_mib: int | None = None,
    ) -> WorkspaceInfo:
        """``POST /v1/workspaces``: fork a sandbox of ``snapshot_tag`` under a name that
        lives through suspend and resume (forkd 0.5's workspaces, E2B's pause/resume)."""
        call = _calls.create_workspace(name, snapshot_tag, per_child_netns=per_child_netns,
                                       memory_limit_mib=memory_limit_mib)
        return cast(WorkspaceInfo, self._send(call))

    def list_workspaces(self) -> list[WorkspaceInfo]:
        """``GET /v1/workspaces``."""
        return cast(list[WorkspaceInfo], self._send(_calls.list_workspaces()))

    def get_workspace(self, name: str) -> WorkspaceInfo:
        """``GET /v1/workspaces/{name}``: ``status`` is running, suspended or stale."""
        return cast(WorkspaceInfo, self._send(_calls.get_workspace(name)))

    def delete_workspace(self, name: str) -> None:
        """``DELETE /v1/workspaces/{name}``: kill its sandbox (or drop its saved state)."""
        self._send(_calls.delete_workspace(name))

    def suspend_workspace(self, name: str, *, diff: bool = False) -> WorkspaceInfo:
        """``POST /v1/workspaces/{name}/suspend``: branch its sandbox to a state snapshot,
        then stop it. ``diff`` pauses it for less time (state as of the end of the copy)."""
        return cast(WorkspaceInfo, self._send(_calls.suspend_workspace(name, diff=diff)))

    def resume_workspace(self, name: str) -> WorkspaceInfo:
        """``POST /v1/workspaces/{name}/resume``: start its sandbox again, under the same id."""
        return cast(WorkspaceInfo, self._send(_calls.resume_workspace(name)))


__all__ = ["DEFAULT_WAIT_SECS", "Controller"]
