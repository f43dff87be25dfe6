"""What the routes need from the app: the runtime, metrics and the branch gate.

``RuntimeLike`` spells out the part of ``forkd.controller.runtime.Runtime``
the API uses, so the routes type-check without importing the controller
(which pulls in the VMM) and tests can hand in a small fake.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.requests import HTTPConnection

from forkd.api.limits import BranchGate
from forkd.api.metrics import Metrics
from forkd.controller.options import ForkOptions, SpawnOptions
from forkd.controller.results import (
    ApplyResult,
    CancelResult,
    CheckpointReport,
    ContextReport,
    DirListing,
    EvalResult,
    ExecResult,
    FileEntry,
    FsDiff,
    MkdirResult,
    PingResult,
    PoolReport,
    ProcessEntry,
    PromoteResult,
    PullReport,
    PushReport,
    RecordJson,
    SandboxCost,
    SandboxCounts,
    SandboxView,
    SignalResult,
    StdinResult,
    VolumeExportReport,
    VolumeReport,
    WorkspaceReport,
)
from forkd.errors import Busy, InvalidRequest
from forkd.host.egress import EgressPolicy


class Record(Protocol):
    def info(self) -> RecordJson: ...


class SandboxLike(Record, Protocol):
    """A sandbox's record (store.records.SandboxRecord), as far as the E2B layer reads it."""

    @property
    def hibernation(self) -> object | None: ...
    @property
    def auto_resume(self) -> bool: ...
    @property
    def ip(self) -> str | None: ...
    @property
    def egress(self) -> EgressPolicy: ...


class FilesLike(Protocol):
    """``Runtime.files`` (controller/files.py), as the file routes and E2B's filesystem call it."""

    async def stat(self, sandbox_id: str, path: str, *, user: str | None = None) -> FileEntry: ...
    async def list(self, sandbox_id: str, path: str, *, user: str | None = None) -> DirListing: ...
    async def mkdir(
        self, sandbox_id: str, path: str, *, parents: bool = False, user: str | None = None,
    ) -> MkdirResult: ...
    async def remove(
        self, sandbox_id: str, path: str, *, recursive: bool = False, user: str | None = None,
    ) -> None: ...
    async def move(
        self, sandbox_id: str, source: str, destination: str, *, user: str | None = None,
    ) -> FileEntry: ...
    async def write(
        self, sandbox_id: str, path: str, chunks: AsyncIterable[bytes], *,
        max_bytes: int, mode: int | None = None, user: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> FileEntry: ...
    async def open_read(
        self, sandbox_id: str, path: str, *, user: str | None = None,
    ) -> tuple[FileEntry, AsyncIterator[bytes]]: ...


class ProcessesLike(Protocol):
    """``Runtime.processes`` (controller/processes.py), as the process routes call it."""

    async def run(
        self, sandbox_id: str, args: list[str], *, env: dict[str, str] | None = None,
        cwd: str | None = None, stdin: bytes | None = None, stdin_open: bool = False,
        tag: str | None = None, timeout_secs: float | None = None, kill_on_close: bool = True,
        user: str | None = None, pty: tuple[int, int] | None = None,
    ) -> Any: ...
    async def start(
        self, sandbox_id: str, args: list[str], *, env: dict[str, str] | None = None,
        cwd: str | None = None, stdin: bytes | None = None, stdin_open: bool = False,
        tag: str | None = None, timeout_secs: float | None = None, user: str | None = None,
    ) -> ProcessEntry: ...
    async def attach(self, sandbox_id: str, pid: int, *, from_start: bool = True) -> Any: ...
    async def list(self, sandbox_id: str) -> list[ProcessEntry]: ...
    async def get(self, sandbox_id: str, pid: int) -> ProcessEntry: ...
    async def write_stdin(
        self, sandbox_id: str, pid: int, data: bytes, *, eof: bool = False
    ) -> StdinResult: ...
    async def signal(
        self, sandbox_id: str, pid: int, sig: int | str, *, group: bool = True
    ) -> SignalResult: ...
    async def kill(self, sandbox_id: str, pid: int) -> None: ...
    async def resize(self, sandbox_id: str, pid: int, cols: int, rows: int) -> None: ...


class KernelsLike(Protocol):
    """``Runtime.kernels`` (controller/kernel_cells.py), as the code route calls it."""

    async def run(
        self, sandbox_id: str, code: str, *, context: str | None = None, timeout_secs: float = 300.0,
        env: dict[str, str] | None = None, cwd: str | None = None, language: str | None = None,
    ) -> Any: ...


class CostsLike(Protocol):
    """``Runtime.costs`` (controller/costs.py): what a sandbox costs the host."""

    async def of(self, sandbox_id: str) -> SandboxCost: ...
    def totals(self) -> dict[str, int]: ...


class DiffsLike(Protocol):
    """``Runtime.diffs`` (controller/diffs.py, diff_render.py, applies.py): a sandbox's changes."""

    async def diff(self, sandbox_id: str, against: str = "parent", *, include: list[str] | None = None,
                   exclude: list[str] | None = None) -> FsDiff: ...
    async def render(self, sandbox_id: str, against: str, fmt: str, *, include: list[str] | None = None,
                     exclude: list[str] | None = None) -> bytes: ...
    async def apply(self, target: str, source: str, paths: list[str] | None = None) -> ApplyResult: ...


class CheckpointsLike(Protocol):
    """``Runtime.checkpoints`` (controller/checkpoints.py): a sandbox's auto-checkpoint policy."""

    def set(self, sandbox_id: str, every: int, keep: int, mode: str = "diff") -> CheckpointReport: ...
    def get(self, sandbox_id: str) -> CheckpointReport: ...
    def delete(self, sandbox_id: str) -> CheckpointReport: ...


class TravelLike(Protocol):
    """``Runtime.travel`` (controller/travel.py): snapshots to and from the object store."""

    async def push(self, tag: str, *, force: bool = False) -> PushReport: ...
    async def pull(self, tag: str) -> PullReport: ...


class WorkspacesLike(Protocol):
    """``Runtime.workspaces`` (controller/workspaces.py): named sandboxes that suspend and resume.
    Its records are described by ``info`` (forkd 0.5's WorkspaceInfo)."""

    def info(self, ws: Any) -> WorkspaceReport: ...
    def get(self, name: str) -> Any: ...
    def all(self) -> list[Any]: ...
    async def create(self, name: str, snapshot_tag: str, *, per_child_netns: bool = False,
                     memory_limit_mib: int | None = None) -> Any: ...
    async def suspend(self, name: str, *, mode: str = "full") -> Any: ...
    async def resume(self, name: str) -> Any: ...
    async def delete(self, name: str) -> None: ...


class VolumesLike(Protocol):
    """``Runtime.volumes`` (controller/volumes.py): named volumes. Its records are described by
    ``info`` (VolumeInfo)."""

    def info(self, vol: Any) -> VolumeReport: ...
    def get(self, name: str) -> Any: ...
    def all(self) -> list[Any]: ...
    async def create(self, name: str, *, size_mib: int = ..., fs: str = "ext4",
                     source: str | None = None) -> Any: ...
    def delete(self, name: str) -> None: ...
    async def export(self, name: str, to: str, snapshot: str | None = None) -> VolumeExportReport: ...


class PoolsLike(Protocol):
    """``Runtime.pools`` (controller/pools.py): warm pools of paused children per snapshot."""

    async def configure(
        self, tag: str, size: int, *, memory_limit_mib: int | None = None, per_child_netns: bool = False,
        live_fork: bool = False, allow_internet_access: bool | None = None,
        network: dict[str, Any] | None = None,
    ) -> PoolReport: ...
    def get(self, tag: str) -> PoolReport: ...
    def all(self) -> list[PoolReport]: ...
    def take_refill_times(self) -> list[tuple[str, float]]: ...


class HibernationLike(Protocol):
    """``Runtime.hibernation`` (controller/hibernation.py): sandboxes to disk and back on use."""

    async def hibernate(self, sandbox_id: str, *, idle: bool = False, memory: bool = True) -> Record: ...


class TagsLike(Protocol):
    """``Runtime.tags`` (controller/tags.py): the snapshot tags a branch or build is writing now."""

    def in_flight(self, tag: str) -> bool: ...


class PausedLike(Protocol):
    """``Runtime.suspender`` (controller/suspend.py), as E2B's snapshot routes read it."""

    def all(self) -> list[Any]: ...


class BuildsLike(Protocol):
    """``Runtime.builds`` (controller/template_build.py): Dockerfile builds and their contexts."""

    async def put_context(self, chunks: AsyncIterable[bytes]) -> ContextReport: ...
    async def build(self, req: Any, emit: Any = ...) -> Any: ...


class ImagesLike(Protocol):
    """``Runtime.images`` (controller/images.py): guest images, and pulls from registries."""

    def list(self) -> list[dict[str, Any]]: ...
    async def pull(self, req: Any, emit: Any = ...) -> Any: ...


class RuntimeLike(Protocol):
    """The routes' view of ``Runtime``: the same names, parameters and kinds.

    tests/unit/test_fake_runtime.py checks every method here against ``Runtime``
    and the test fake (names, kinds, defaults), and mypy checks below that
    ``Runtime`` satisfies it, so the three cannot drift apart.
    """

    # Sub-APIs: the routes call the owners directly (read-only here, so the real owner classes
    # and the fake's stand-ins both satisfy them).
    @property
    def files(self) -> FilesLike: ...
    @property
    def processes(self) -> ProcessesLike: ...
    @property
    def kernels(self) -> KernelsLike: ...
    @property
    def checkpoints(self) -> CheckpointsLike: ...
    @property
    def costs(self) -> CostsLike: ...
    @property
    def diffs(self) -> DiffsLike: ...
    @property
    def travel(self) -> TravelLike: ...
    @property
    def workspaces(self) -> WorkspacesLike: ...
    @property
    def volumes(self) -> VolumesLike: ...
    @property
    def pools(self) -> PoolsLike: ...
    @property
    def hibernation(self) -> HibernationLike: ...
    @property
    def builds(self) -> BuildsLike: ...
    @property
    def images(self) -> ImagesLike: ...
    @property
    def tags(self) -> TagsLike: ...
    @property
    def suspender(self) -> PausedLike: ...

    async def close(self, *, keep_sandboxes: bool = False) -> None: ...
    async def create_snapshot(self, spec: Any, progress: Any = ...) -> Record: ...
    def list_snapshots(self) -> list[Any]: ...
    def get_snapshot(self, tag: str) -> Record: ...
    async def delete_snapshot(self, tag: str, *, cascade: bool = False, force: bool = False) -> None: ...
    def snapshot_lineage(self, tag: str) -> RecordJson: ...
    async def spawn(self, tag: str, n: int = 1, options: SpawnOptions | None = None) -> list[Any]: ...
    async def fork(self, sandbox_id: str, count: int = 1, options: ForkOptions | None = None, *,
                   tree: bool = False) -> Any: ...
    async def promote(
        self,
        sandbox_id: str,
        *,
        tree_id: str | None = None,
        cleanup_siblings: bool = True,
        replace_parent: bool = False,
    ) -> PromoteResult: ...
    def list_sandboxes(self, *, after: str | None = None, limit: int | None = None,
                       where: Callable[[Any], bool] | None = None) -> list[Any]: ...
    def count_sandboxes(self) -> SandboxCounts: ...
    def get_sandbox(self, sandbox_id: str) -> SandboxLike: ...
    def relaying(self, sandbox_id: str) -> AbstractAsyncContextManager[SandboxLike]: ...
    async def kill(self, sandbox_id: str) -> None: ...
    def set_timeout(self, sandbox_id: str, timeout_secs: float) -> Record: ...
    async def update_network(self, sandbox_id: str, egress: EgressPolicy) -> Record: ...
    def network_log(self, sandbox_id: str) -> list[dict[str, Any]]: ...
    async def ping(self, sandbox_id: str) -> PingResult: ...
    async def exec(
        self,
        sandbox_id: str,
        args: list[str],
        timeout_secs: float = 30,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | None = None,
        max_output_bytes: int | None = None,
        user: str | None = None,
    ) -> ExecResult: ...
    async def eval(self, sandbox_id: str, code: str, timeout_secs: float = 60) -> EvalResult: ...
    async def cancel_eval(self, sandbox_id: str) -> CancelResult: ...
    async def branch(
        self, sandbox_id: str, tag: str | None = None, mode: str = "full", wait: bool = True, *,
        measure_diff: bool = False, parent_tag: str | None = None,
    ) -> Record: ...
    async def compact_snapshot(self, tag: str, to: str) -> Record: ...
    async def pause(self, sandbox_id: str, *, mode: str = "full") -> Record: ...
    async def resume(self, sandbox_id: str, *, timeout_secs: float | None = None) -> Record: ...
    def describe_sandbox(self, sandbox_id: str) -> SandboxView: ...
    def describe_sandboxes(self) -> list[SandboxView]: ...


if TYPE_CHECKING:
    from forkd.controller.runtime import Runtime

    def _runtime_is_runtime_like(runtime: Runtime) -> RuntimeLike:
        """Never called: mypy fails here when ``Runtime`` stops satisfying ``RuntimeLike``."""
        return runtime


# The dependencies are ``async def`` on purpose: FastAPI runs a plain ``def`` dependency in
# its thread pool, a thread hand-off per request that cost more daemon CPU than the route.
async def get_runtime(request: HTTPConnection) -> RuntimeLike:
    # HTTPConnection: a WebSocket route (api/terminal_routes.py) asks for it too.
    runtime: RuntimeLike | None = request.app.state.runtime
    if runtime is None:
        # Only reachable between process start and the end of lifespan start-up.
        raise Busy("the daemon is still starting; retry shortly")
    return runtime


async def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


async def get_branch_gate(request: Request) -> BranchGate:
    gate: BranchGate = request.app.state.branch_gate
    return gate


async def reject_unknown_query(request: HTTPConnection) -> None:
    """400 for a query parameter the route does not take (a typo must not be silently ignored,
    e.g. ``?cascde=true`` on a DELETE, or a misspelt list filter that would list everything)."""
    if not request.scope.get("query_string"):  # most requests: nothing to parse
        return
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or not request.query_params:
        return
    allowed = _query_names(route.dependant)
    unknown = sorted(set(request.query_params.keys()) - allowed)
    if unknown:
        takes = ", ".join(sorted(allowed)) or "none"
        raise InvalidRequest(f"unknown query parameter {unknown[0]!r}; this route takes: {takes}")


def _query_names(dependant: Dependant) -> set[str]:
    """The query parameters a route takes, its dependencies' included."""
    names = {p.alias for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names
