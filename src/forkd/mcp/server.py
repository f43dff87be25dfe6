"""The MCP server: one tool per thing an agent does with sandboxes.

Tools call the daemon over REST through :class:`~forkd.sdk.AsyncController`
(one per server lifespan); a daemon error becomes a tool error carrying its
HTTP status and the daemon's message, so the model sees why and what to fix.
Tool descriptions are written for a model choosing between them: what the
tool does, when to use it rather than a neighbour, and what it returns.
"""

from __future__ import annotations

import base64
import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

import httpx
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from forkd.api.schemas import (
    ApplyResponse,
    EvalResponse,
    ExecResponse,
    FileInfo,
    FileList,
    ForkResponse,
    PromoteResponse,
    SandboxDiff,
    SnapshotDetail,
    SnapshotInfo,
)
from forkd.config import VERSION
from forkd.mcp.cells import code_tools
from forkd.mcp.models import Deleted, FileContent, SandboxList, SandboxPatch, SnapshotList
from forkd.mcp.processes import process_tools
from forkd.mcp.tooling import CREATES, DESTROYS, READ_ONLY, Command, Cwd, Env, ExtraEnv, SandboxId, call
from forkd.sdk import AsyncController
from forkd.sdk.models import NetworkPolicy

if TYPE_CHECKING:
    from typing_extensions import Buffer

# What one read_file may hand to a model: a guest can write files of any size.
DEFAULT_READ_BYTES = 64 * 1024
MAX_READ_BYTES = 4 * 1024 * 1024

INSTRUCTIONS = """\
forkd runs sandboxes: QEMU microVMs forked copy-on-write from snapshots of a warm
VM (Python with numpy already imported). Typical flow: list_snapshots (or
create_snapshot once), spawn_sandboxes, then exec_command / eval_python /
read_file / write_file in a sandbox (run_code for notebook cells with plots, on
images with a Jupyter kernel). For anything that runs long (a server, a
build, training), start_process, then read_process_output / send_process_input /
kill_process. Sandboxes reach no network unless their snapshot has a NIC and
spawn_sandboxes opens egress. To try several ideas from one state, use
fork_tree on a running sandbox, work in each child, then promote_sandbox the best
one (its siblings are killed). branch_sandbox saves a running sandbox as a new
snapshot to spawn from later. kill_sandbox when done: sandboxes keep running
(and using memory) until killed."""

@dataclass(frozen=True)
class DaemonAddress:
    """How the server reaches the daemon; None means the SDK's defaults (FORKD_URL, FORKD_TOKEN)."""

    url: str | None = None
    token: str | None = None
    ca_cert: str | None = None


class _TooLarge(Exception):
    """Raised by :class:`_BoundedSink` to stop a download at its limit."""


class _BoundedSink(io.BytesIO):
    """Keeps the first ``limit`` bytes of a download, then stops it."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    @property
    def data(self) -> bytes:
        return self.getvalue()

    def write(self, chunk: Buffer, /) -> int:
        piece = bytes(chunk)
        room = self.limit - self.tell()
        super().write(piece[:room])
        if len(piece) > room:
            raise _TooLarge
        return len(piece)


def _text_or_base64(data: bytes, truncated: bool) -> tuple[str, str, int]:
    """``(content, encoding, bytes returned)``: UTF-8 text if it is text, else base64.

    A cut file may end inside a multi-byte character: up to 3 trailing bytes are
    dropped before giving up on text.
    """
    for cut in range(4 if truncated else 1):
        kept = data[: len(data) - cut]
        try:
            return kept.decode("utf-8"), "utf-8", len(kept)
        except UnicodeDecodeError:
            continue
    return base64.b64encode(data).decode("ascii"), "base64", len(data)


def build_server(
    address: DaemonAddress | None = None, *, transport: httpx.AsyncBaseTransport | None = None
) -> MCPServer[AsyncController]:
    """The MCP server with every forkd tool, talking to the daemon at ``address``.

    ``transport`` replaces the HTTP transport (unit tests use ``httpx.MockTransport``).
    """
    address = address or DaemonAddress()

    @asynccontextmanager
    async def lifespan(_: MCPServer[AsyncController]) -> AsyncIterator[AsyncController]:
        async with AsyncController(
            url=address.url, token=address.token, verify=address.ca_cert, transport=transport
        ) as c:
            yield c

    server: MCPServer[AsyncController] = MCPServer(
        "forkd",
        title="forkd sandboxes",
        instructions=INSTRUCTIONS,
        version=VERSION,
        lifespan=lifespan,
        # stderr is the MCP client's log: warnings only, not a line per HTTP request to the daemon.
        log_level="WARNING",
    )
    _snapshot_tools(server)
    _sandbox_tools(server)
    _file_tools(server)
    _fork_tools(server)
    process_tools(server)
    code_tools(server)
    return server


def _snapshot_tools(server: MCPServer[AsyncController]) -> None:
    @server.tool(annotations=READ_ONLY)
    async def list_snapshots(ctx: Context[Any, Any]) -> SnapshotList:
        """List every snapshot: the tags sandboxes can be spawned from.

        Each has a `status` ("ready" can be spawned; "writing" is a branch still
        being saved); branches also have `branched_from` (the source sandbox).
        """
        infos = await call(ctx, lambda c: c.list_snapshots())
        return SnapshotList(snapshots=[SnapshotInfo.model_validate(i) for i in infos])

    @server.tool(annotations=READ_ONLY)
    async def get_snapshot(
        ctx: Context[Any, Any], tag: Annotated[str, Field(description="Snapshot tag.")]
    ) -> SnapshotDetail:
        """One snapshot with its lineage: `ancestors` (nearest first), `dependents`
        (snapshots branched from it) and `sandboxes` (live ones spawned from it)."""
        return SnapshotDetail.model_validate(await call(ctx, lambda c: c.get_snapshot(tag)))

    @server.tool(annotations=CREATES)
    async def create_snapshot(
        ctx: Context[Any, Any],
        tag: Annotated[str, Field(description="Name of the new snapshot (letters, digits, . _ -).")],
        setup: Annotated[list[str] | None, Field(
            description="Shell commands run in the VM before the snapshot, "
            "e.g. ['pip install requests'].")] = None,
        setup_eval: Annotated[list[str] | None, Field(
            description="Python code run in the warm interpreter after setup (e.g. load a dataset); "
            "every sandbox spawned later starts with its results in memory.")] = None,
        warm_imports: Annotated[list[str] | None, Field(
            description="Python modules imported before the snapshot (default ['numpy']).")] = None,
        mem_mib: Annotated[int | None, Field(description="Guest RAM in MiB (default 512).")] = None,
        nic: Annotated[bool, Field(description=(
            "Give the VM, and every sandbox spawned from it, a network device: each sandbox gets "
            "its own ip (reachable from the host) and may be allowed egress at spawn."))] = False,
    ) -> SnapshotInfo:
        """Boot a fresh template VM, warm it up, run `setup`, and save it as snapshot `tag`.

        Slow (tens of seconds): do it once per environment, then spawn_sandboxes
        from the tag many times. To save the state of a sandbox that is already
        running, use branch_sandbox instead.
        """
        extra: dict[str, Any] = {"setup_eval": setup_eval} if setup_eval else {}
        info = await call(ctx, lambda c: c.create_snapshot(
            tag, setup=setup, warm_imports=warm_imports, mem_mib=mem_mib, nic=nic, **extra))
        return SnapshotInfo.model_validate(info)

    @server.tool(annotations=DESTROYS)
    async def delete_snapshot(
        ctx: Context[Any, Any],
        tag: Annotated[str, Field(description="Snapshot tag.")],
        cascade: Annotated[bool, Field(description="Also delete the snapshots branched from it.")] = False,
        force: Annotated[bool, Field(description="Also kill the sandboxes running from it.")] = False,
    ) -> Deleted:
        """Delete a snapshot and its files. Refused (409) while sandboxes run from it or
        snapshots depend on it, unless `force` / `cascade`."""
        await call(ctx, lambda c: c.delete_snapshot(tag, cascade=cascade, force=force))
        return Deleted(deleted=tag)


def _sandbox_tools(server: MCPServer[AsyncController]) -> None:
    @server.tool(annotations=CREATES)
    async def spawn_sandboxes(
        ctx: Context[Any, Any],
        snapshot_tag: Annotated[str, Field(description="Snapshot to spawn from (see list_snapshots).")],
        n: Annotated[int, Field(ge=1, le=1000, description="Number of sandboxes.")] = 1,
        env: Annotated[Env | None, Field(description="Environment variables for every sandbox.")] = None,
        child_env: Annotated[list[Env] | None, Field(
            description="One environment per sandbox (length n), over env.")] = None,
        metadata: Annotated[dict[str, str] | None, Field(
            description="Labels stored with each sandbox (list_sandboxes filters on them).")] = None,
        timeout_secs: Annotated[float | None, Field(
            gt=0, description="Kill each sandbox this many seconds from now (default: never).")] = None,
        live_fork: Annotated[bool, Field(
            description="Allow mode='live' branches of these sandboxes later.")] = False,
        allow_internet_access: Annotated[bool, Field(description=(
            "Let the sandboxes reach the public internet (denied by default). Needs a snapshot "
            "made with nic=true."))] = False,
        allow_out: Annotated[list[str] | None, Field(description=(
            "Destinations always open, even private ones: IPv4 addresses, CIDRs or DNS names "
            "('*.NAME': the names below it), optionally with :PORT or :FIRST-LAST, e.g. "
            "['10.201.0.1:8080', 'pypi.org:443']. Needs nic=true."))] = None,
        deny_out: Annotated[list[str] | None, Field(description=(
            "Destinations closed even with allow_internet_access (same form as allow_out)."))] = None,
    ) -> SandboxList:
        """Start `n` new sandboxes from a snapshot, each a separate microVM that begins
        in the snapshot's exact state (copy-on-write, milliseconds each).

        Use this to get a fresh sandbox. To copy a sandbox that is already running
        (with everything it has done since), use fork_sandbox or fork_tree. Outbound
        network traffic is denied unless allow_internet_access or allow_out open it;
        each sandbox's `ip` and `network` (its egress policy) are in the reply.
        """
        network: NetworkPolicy | None = ({"allow_out": allow_out or [], "deny_out": deny_out or []}
                                         if allow_out or deny_out else None)
        infos = await call(ctx, lambda c: c.spawn_sandboxes(
            snapshot_tag, n=n, live_fork=live_fork, env=env, child_env=child_env,
            metadata=metadata, timeout_secs=timeout_secs,
            allow_internet_access=allow_internet_access, network=network))
        return SandboxList.model_validate({"sandboxes": infos})

    @server.tool(annotations=READ_ONLY)
    async def list_sandboxes(
        ctx: Context[Any, Any],
        snapshot_tag: Annotated[str | None, Field(
            description="Only sandboxes spawned from this snapshot.")] = None,
        metadata: Annotated[dict[str, str] | None, Field(
            description="Only sandboxes whose labels include all these key/value pairs, "
            "e.g. {'fork_tree_id': 'ft-...'} for one fork-tree.")] = None,
    ) -> SandboxList:
        """List the running sandboxes (optionally filtered)."""
        infos = await call(ctx, lambda c: c.list_sandboxes(snapshot_tag=snapshot_tag, metadata=metadata))
        return SandboxList.model_validate({"sandboxes": infos})

    @server.tool(annotations=DESTROYS)
    async def kill_sandbox(ctx: Context[Any, Any], sandbox_id: SandboxId) -> Deleted:
        """Stop a sandbox for good and free its memory. Snapshots branched from it stay."""
        await call(ctx, lambda c: c.kill_sandbox(sandbox_id))
        return Deleted(deleted=sandbox_id)

    @server.tool(annotations=CREATES)
    async def exec_command(
        ctx: Context[Any, Any],
        sandbox_id: SandboxId,
        command: Command,
        timeout_secs: Annotated[float, Field(gt=0, le=86400, description="Kill it after this long.")] = 30,
        cwd: Cwd = None,
        env: ExtraEnv = None,
        stdin: Annotated[str | None, Field(description="Text fed to standard input.")] = None,
    ) -> ExecResponse:
        """Run a command (a new process) in a sandbox, wait for it, and return its stdout,
        stderr and exit_code. A failing command is a normal result: check exit_code. After
        timeout_secs it is killed and you get the output it wrote until then, with
        timed_out=true.

        For a command that may run long or must keep running (a server, a build), use
        start_process instead. For Python, eval_python is faster and keeps variables
        between calls.
        """
        body = await call(ctx, lambda c: c.exec(
            sandbox_id, command, timeout_secs=timeout_secs, env=env, cwd=cwd, stdin=stdin))
        return ExecResponse.model_validate(body)

    @server.tool(annotations=CREATES)
    async def eval_python(
        ctx: Context[Any, Any],
        sandbox_id: SandboxId,
        code: Annotated[str, Field(description="Python statements; a trailing expression is the result.")],
        timeout_secs: Annotated[float, Field(gt=0, le=86400, description=(
            "Interrupt the code after this long (it then answers TimeoutError)."))] = 60,
    ) -> EvalResponse:
        """Run Python code in the sandbox's already-running interpreter (numpy imported),
        like a REPL: variables persist between calls, the value of a trailing
        expression comes back as `result` (its repr), an exception as `error`.
        Code still running after timeout_secs is interrupted (its variables stay);
        cancel_eval interrupts an eval whose caller gave up."""
        return EvalResponse.model_validate(
            await call(ctx, lambda c: c.eval(sandbox_id, code, timeout=timeout_secs)))


def _file_tools(server: MCPServer[AsyncController]) -> None:
    @server.tool(annotations=READ_ONLY)
    async def read_file(
        ctx: Context[Any, Any],
        sandbox_id: SandboxId,
        path: Annotated[str, Field(description="Absolute path in the sandbox.")],
        max_bytes: Annotated[int, Field(
            ge=1, le=MAX_READ_BYTES, description="Return at most this many bytes (the start of the file).")]
            = DEFAULT_READ_BYTES,
    ) -> FileContent:
        """Read a file from a sandbox. Text comes back as UTF-8; anything else as base64.
        Large files are cut at max_bytes (`truncated` says so)."""
        sink = _BoundedSink(max_bytes)

        async def read(c: AsyncController) -> int:
            info = await c.file_stat(sandbox_id, path)
            with suppress(_TooLarge):
                await c.read_file_into(sandbox_id, path, sink)
            return int(info["size"])

        size = await call(ctx, read)
        truncated = size > len(sink.data)
        text, encoding, returned = _text_or_base64(bytes(sink.getvalue()), truncated)
        return FileContent(path=path, size=size, encoding=encoding, content=text,
                           returned=returned, truncated=truncated)

    @server.tool(annotations=CREATES)
    async def write_file(
        ctx: Context[Any, Any],
        sandbox_id: SandboxId,
        path: Annotated[str, Field(description="Absolute path in the sandbox; replaced if it exists.")],
        content: Annotated[str, Field(
            description="The file's contents (text, or base64 with encoding='base64').")],
        encoding: Annotated[Literal["utf-8", "base64"], Field(
            description="How content is encoded.")] = "utf-8",
        mode: Annotated[int | None, Field(ge=0, le=0o7777, description="Permission bits, e.g. 493 (0o755).")]
            = None,
    ) -> FileInfo:
        """Create or replace a file in a sandbox (atomically). Parent directories must exist
        (create them with exec_command 'mkdir -p DIR')."""
        try:
            data = base64.b64decode(content, validate=True) if encoding == "base64" else content.encode()
        except ValueError as exc:
            raise ToolError(f"content is not valid base64: {exc}") from exc
        info = await call(ctx, lambda c: c.write_file(sandbox_id, path, data, mode=mode))
        return FileInfo.model_validate(info)

    @server.tool(annotations=READ_ONLY)
    async def list_files(
        ctx: Context[Any, Any],
        sandbox_id: SandboxId,
        path: Annotated[str, Field(description="Absolute directory path in the sandbox.")] = "/",
    ) -> FileList:
        """List a directory in a sandbox: name, type (file/dir/symlink/other), size, mode, mtime."""
        return FileList.model_validate(await call(ctx, lambda c: c.file_list(sandbox_id, path)))


def _fork_tools(server: MCPServer[AsyncController]) -> None:
    @server.tool(annotations=CREATES)
    async def branch_sandbox(
        ctx: Context[Any, Any],
        sandbox_id: SandboxId,
        tag: Annotated[str | None, Field(description="Tag of the new snapshot (default generated).")] = None,
        mode: Annotated[Literal["full", "diff", "live"], Field(
            description="'full' (default), 'diff' (shorter pause), or 'live' (shortest; the sandbox "
            "must have been spawned with live_fork).")] = "full",
    ) -> SnapshotInfo:
        """Save a running sandbox's exact state (memory, processes, files) as a new snapshot,
        pausing it only briefly; it keeps running. spawn_sandboxes from the returned
        tag later to go back to this point. To get running copies right away, use
        fork_sandbox or fork_tree."""
        info = await call(ctx, lambda c: c.branch_sandbox(sandbox_id, tag=tag, mode=mode))
        return SnapshotInfo.model_validate(info)

    @server.tool(annotations=CREATES)
    async def fork_sandbox(
        ctx: Context[Any, Any],
        sandbox_id: SandboxId,
        count: Annotated[int, Field(ge=1, le=1000, description="Number of copies.")] = 1,
        env: Annotated[Env | None, Field(description="Environment variables for every copy.")] = None,
        child_env: Annotated[list[Env] | None, Field(
            description="One environment per copy (length count), over env.")] = None,
    ) -> ForkResponse:
        """Copy a running sandbox into `count` new sandboxes that continue from its current
        state (variables, files, processes); the source keeps running. Each copy
        succeeds or fails alone (`children`, `errors`). To later keep only the best
        copy, use fork_tree instead."""
        body = await call(ctx, lambda c: c.fork_sandbox(sandbox_id, count, env=env, child_env=child_env))
        return ForkResponse.model_validate(body)

    @server.tool(annotations=CREATES)
    async def fork_tree(
        ctx: Context[Any, Any],
        sandbox_id: SandboxId,
        count: Annotated[int, Field(
            ge=1, le=1000, description="Number of copies (one per idea to try).")] = 2,
        env: Annotated[Env | None, Field(description="Environment variables for every copy.")] = None,
        child_env: Annotated[list[Env] | None, Field(
            description="One environment per copy (length count), e.g. a different hint each.")] = None,
    ) -> ForkResponse:
        """Like fork_sandbox, but the copies form a fork-tree (`tree_id`): try a different
        idea in each, then call promote_sandbox on the best one to keep it and kill the rest."""
        body = await call(ctx, lambda c: c.fork_tree(sandbox_id, count, env=env, child_env=child_env))
        return ForkResponse.model_validate(body)

    @server.tool(annotations=READ_ONLY)
    async def get_sandbox_diff(
        ctx: Context[Any, Any],
        sandbox_id: SandboxId,
        against: Annotated[str, Field(description=(
            "parent (the snapshot it was forked from), snapshot:TAG or sandbox:ID."))] = "parent",
        include: Annotated[list[str] | None, Field(description="Only under these paths.")] = None,
    ) -> SandboxDiff:
        """What a sandbox's files changed since it was forked (added, modified, deleted, with mode and
        owner changes): see what a fork_tree child did before promoting it or applying it with
        apply_changes. get_sandbox_patch shows the same change as a unified diff."""
        body = await call(ctx, lambda c: c.sandbox_diff(sandbox_id, against, include=include))
        return SandboxDiff.model_validate(body)

    @server.tool(annotations=READ_ONLY)
    async def get_sandbox_patch(
        ctx: Context[Any, Any],
        sandbox_id: SandboxId,
        against: Annotated[str, Field(description=(
            "parent (the snapshot it was forked from), snapshot:TAG or sandbox:ID."))] = "parent",
        include: Annotated[list[str] | None, Field(description="Only under these paths.")] = None,
    ) -> SandboxPatch:
        """A sandbox's file changes since it was forked as a unified diff, e.g. for a pull request."""
        text = await call(ctx, lambda c: c.sandbox_diff(sandbox_id, against, include=include, format="patch"))
        return SandboxPatch(sandbox_id=sandbox_id, against=against, patch=str(text))

    @server.tool(annotations=CREATES)
    async def apply_changes(
        ctx: Context[Any, Any],
        sandbox_id: Annotated[str, Field(description="The sandbox to write into (the parent, typically).")],
        source: Annotated[str, Field(description="The sandbox whose changes since its fork to apply.")],
        paths: Annotated[list[str] | None, Field(description="Only changes under these paths.")] = None,
    ) -> ApplyResponse:
        """Apply a child's changes (since its fork) onto another sandbox, typically the parent that is
        still running. If the target changed one of the same files differently, the error names every
        such file and nothing is written."""
        body = await call(ctx, lambda c: c.apply_changes(sandbox_id, source, paths))
        return ApplyResponse.model_validate(body)

    @server.tool(annotations=DESTROYS)
    async def promote_sandbox(
        ctx: Context[Any, Any],
        sandbox_id: Annotated[str, Field(description="The fork-tree child to keep.")],
        cleanup_siblings: Annotated[bool, Field(description="Kill the other children of its tree.")] = True,
        replace_parent: Annotated[bool, Field(
            description="Also kill the tree's source sandbox; its id then refers to this one.")] = False,
    ) -> PromoteResponse:
        """Keep one child of a fork_tree as the winner: kill its siblings (and with
        replace_parent the source too). Returns what was killed."""
        body = await call(ctx, lambda c: c.promote_sandbox(
            sandbox_id, cleanup_siblings=cleanup_siblings, replace_parent=replace_parent))
        return PromoteResponse.model_validate(body)
