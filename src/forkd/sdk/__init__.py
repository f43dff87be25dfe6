"""Python SDK for the forkd daemon's REST API.

``Controller`` / ``AsyncController`` map one-to-one onto the REST routes and
return the daemon's JSON; ``Sandbox`` / ``Snapshot`` (and their async twins)
are the object-style layer on top::

    from forkd import Controller, Sandbox

    c = Controller()                      # FORKD_URL, FORKD_TOKEN / FORKD_TOKEN_FILE
    parent = c.spawn_sandboxes("pyagent", n=1, live_fork=True)[0]
    branch = c.branch_sandbox(parent["id"], mode="live", wait=False)
    c.wait_snapshot_ready(branch["tag"])
    kids = c.spawn_sandboxes(branch["tag"], n=5)

    with Sandbox(tag="pyagent") as sb:   # spawns on entry, killed on exit
        print(sb.commands.run("uname -a").stdout)
        forked = sb.fork(3, env={"TRY": "1"})  # sb keeps running; 3 owned children
        best = sb.explore(["a", "b"], run=try_it, score=judge)  # best of N, losers killed

The async modules (``async_client``, ``async_sandbox``) are the source; their
sync twins are generated from them by ``scripts/unasync_sdk.py`` into
``forkd.sdk._generated`` (generated modules only, with the REST API's types that
``forkd.sdk.models`` re-exports), and ``make lint`` and a unit test fail if one drifts.
"""

from forkd.sdk._defaults import default_async_controller, default_controller
from forkd.sdk._generated.client import Controller
from forkd.sdk._generated.guest import Commands, Files
from forkd.sdk._generated.sandbox import Sandbox
from forkd.sdk._generated.snapshot import Snapshot
from forkd.sdk.async_client import AsyncController
from forkd.sdk.async_guest import AsyncCommands, AsyncFiles
from forkd.sdk.async_sandbox import AsyncSandbox
from forkd.sdk.async_snapshot import AsyncSnapshot
from forkd.sdk.errors import (
    BadRequest,
    ConflictError,
    ExploreError,
    ForkdAPIError,
    ForkdConnectionError,
    ForkdTimeoutError,
    NoCapacityError,
    NotFoundError,
    ServerError,
    ServiceUnavailable,
    SnapshotFailedError,
    Unauthorized,
)
from forkd.sdk.execution import Execution, ExecutionError, Logs, Result
from forkd.sdk.types import (
    CheckpointPolicy,
    Checkpoints,
    CommandResult,
    Deletion,
    EvalResult,
    ExploreResult,
    ForkFailure,
    ForkResult,
    Outcome,
    PromoteResult,
    SandboxInfo,
    SnapshotInfo,
    SnapshotView,
    WorkspaceInfo,
)

__all__ = [
    "AsyncCommands",
    "AsyncController",
    "AsyncFiles",
    "AsyncSandbox",
    "AsyncSnapshot",
    "BadRequest",
    "CheckpointPolicy",
    "Checkpoints",
    "CommandResult",
    "Commands",
    "ConflictError",
    "Controller",
    "Deletion",
    "EvalResult",
    "Execution",
    "ExecutionError",
    "ExploreError",
    "ExploreResult",
    "Files",
    "ForkFailure",
    "ForkResult",
    "ForkdAPIError",
    "ForkdConnectionError",
    "ForkdTimeoutError",
    "Logs",
    "NoCapacityError",
    "NotFoundError",
    "Outcome",
    "PromoteResult",
    "Result",
    "Sandbox",
    "SandboxInfo",
    "ServerError",
    "ServiceUnavailable",
    "Snapshot",
    "SnapshotFailedError",
    "SnapshotInfo",
    "SnapshotView",
    "Unauthorized",
    "WorkspaceInfo",
    "default_async_controller",
    "default_controller",
]
