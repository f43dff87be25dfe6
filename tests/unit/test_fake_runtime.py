"""tests/fakes/runtime.py stays a faithful stand-in for the controller's Runtime."""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import forkd.api.code_routes
import forkd.api.file_routes
import forkd.api.fork_routes
import forkd.api.pool_routes
import forkd.api.process_routes
import forkd.api.routes
import forkd.api.template_routes
import forkd.api.travel_routes
import forkd.api.workspace_routes
from forkd.api.deps import (
    BuildsLike,
    CheckpointsLike,
    CostsLike,
    FilesLike,
    HibernationLike,
    KernelsLike,
    PausedLike,
    PoolsLike,
    ProcessesLike,
    RuntimeLike,
    TagsLike,
    TravelLike,
    WorkspacesLike,
)
from forkd.controller.checkpoints import Checkpointer
from forkd.controller.costs import SandboxCosts
from forkd.controller.files import SandboxFiles
from forkd.controller.hibernation import Hibernator
from forkd.controller.kernel_cells import KernelCells
from forkd.controller.options import SpawnOptions
from forkd.controller.pools import PoolKeeper
from forkd.controller.processes import SandboxProcesses
from forkd.controller.runtime import Runtime
from forkd.controller.suspend import Suspender
from forkd.controller.tags import TagReservations
from forkd.controller.template_build import TemplateBuilds
from forkd.controller.travel import SnapshotTravel
from forkd.controller.workspaces import Workspaces
from forkd.errors import Conflict, NotFound
from tests.fakes.runtime import (
    FakeBuilds,
    FakeCheckpoints,
    FakeCosts,
    FakeFiles,
    FakeHibernation,
    FakeKernels,
    FakePaused,
    FakePools,
    FakeProcesses,
    FakeRuntime,
    FakeTags,
    FakeTravel,
    FakeWorkspaces,
)

# Runtime's sub-APIs the routes call directly: (the owner, the routes' protocol, the fake's stand-in).
SUB_APIS: dict[str, tuple[type, type, type]] = {
    "files": (SandboxFiles, FilesLike, FakeFiles),
    "costs": (SandboxCosts, CostsLike, FakeCosts),
    "processes": (SandboxProcesses, ProcessesLike, FakeProcesses),
    "kernels": (KernelCells, KernelsLike, FakeKernels),
    "checkpoints": (Checkpointer, CheckpointsLike, FakeCheckpoints),
    "travel": (SnapshotTravel, TravelLike, FakeTravel),
    "workspaces": (Workspaces, WorkspacesLike, FakeWorkspaces),
    "pools": (PoolKeeper, PoolsLike, FakePools),
    "hibernation": (Hibernator, HibernationLike, FakeHibernation),
    "builds": (TemplateBuilds, BuildsLike, FakeBuilds),
    "tags": (TagReservations, TagsLike, FakeTags),
    "suspender": (Suspender, PausedLike, FakePaused),
}


def _route_modules() -> list[Any]:
    return [forkd.api.routes, forkd.api.code_routes, forkd.api.pool_routes, forkd.api.file_routes,
            forkd.api.fork_routes, forkd.api.travel_routes, forkd.api.process_routes,
            forkd.api.workspace_routes, forkd.api.template_routes]


def _attributes_of_rt() -> list[ast.Attribute]:
    """Every ``rt.<name>`` in forkd/api/*_routes.py and routes.py (``rt`` is the injected Runtime)."""
    found: list[ast.Attribute] = []
    for module in _route_modules():
        tree = ast.parse(Path(inspect.getfile(module)).read_text())
        found += [node for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                  and isinstance(node.value, ast.Name) and node.value.id == "rt"]
    return found


def methods_the_routes_call() -> set[str]:
    """Every ``rt.<name>`` the routes use that is a Runtime method (not a sub-API)."""
    called = {node.attr for node in _attributes_of_rt() if node.attr not in SUB_APIS}
    return called


def sub_api_methods_the_routes_call() -> set[tuple[str, str]]:
    """Every ``rt.<sub-API>.<method>`` in the routes."""
    names: set[tuple[str, str]] = set()
    for module in _route_modules():
        tree = ast.parse(Path(inspect.getfile(module)).read_text())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                    and isinstance(node.value.value, ast.Name) and node.value.value.id == "rt"):
                assert node.value.attr in SUB_APIS, f"rt.{node.value.attr}.{node.attr}: not a known sub-API"
                names.add((node.value.attr, node.attr))
    return names


def sub_api_protocol_methods() -> set[tuple[str, str]]:
    return {(sub, n) for sub, (_, protocol, _) in SUB_APIS.items()
            for n in dir(protocol) if not n.startswith("_") and callable(getattr(protocol, n))}


def shape(fn: Any) -> list[tuple[str, Any, Any]]:
    """Parameter names, kinds and defaults (a callable default counts as 'a callable')."""
    return [
        (p.name, p.kind, "<callable>" if callable(p.default) else p.default)
        for p in inspect.signature(fn).parameters.values()
    ]


def test_the_routes_call_something() -> None:
    assert {"spawn", "branch", "exec", "eval", "create_snapshot"} <= methods_the_routes_call()


@pytest.mark.parametrize("name", sorted(methods_the_routes_call()))
def test_fake_has_the_runtime_signature(name: str) -> None:
    real = getattr(Runtime, name)
    fake = getattr(FakeRuntime, name)
    assert shape(fake) == shape(real), f"FakeRuntime.{name} drifted from Runtime.{name}"
    assert inspect.iscoroutinefunction(fake) == inspect.iscoroutinefunction(real), name


@pytest.mark.parametrize("name", sorted(methods_the_routes_call()))
def test_the_routes_protocol_has_the_runtime_signature(name: str) -> None:
    """``RuntimeLike`` (what the routes type-check against) names the same parameters."""
    def names_and_kinds(fn: Any) -> list[tuple[str, Any, bool]]:
        return [(p.name, p.kind, p.default is p.empty) for p in inspect.signature(fn).parameters.values()]

    real, protocol = getattr(Runtime, name), getattr(RuntimeLike, name)
    assert names_and_kinds(protocol) == names_and_kinds(real), f"RuntimeLike.{name} drifted"
    assert inspect.iscoroutinefunction(protocol) == inspect.iscoroutinefunction(real), name


def test_the_routes_only_call_what_the_protocol_declares() -> None:
    assert methods_the_routes_call() <= protocol_methods()


def protocol_methods() -> set[str]:
    """Every method ``RuntimeLike`` declares (what the routes may call)."""
    return {n for n in dir(RuntimeLike) if not n.startswith("_") and callable(getattr(RuntimeLike, n))
            and n not in SUB_APIS}


def test_the_protocol_declares_what_the_e2b_layer_needs_too() -> None:
    assert {"describe_sandbox", "describe_sandboxes", "pause", "resume"} <= protocol_methods()
    assert ("files", "move") in sub_api_protocol_methods()


def test_the_routes_call_the_sub_apis_and_only_what_their_protocols_declare() -> None:
    called = sub_api_methods_the_routes_call()
    assert {("files", "write"), ("processes", "start"), ("kernels", "run")} <= called
    assert called <= sub_api_protocol_methods()


def test_runtime_and_fake_have_the_sub_apis() -> None:
    for sub, (_, _, fake) in SUB_APIS.items():
        assert isinstance(getattr(RuntimeLike, sub), property), f"RuntimeLike.{sub} is not declared"
        runtime = FakeRuntime()
        assert isinstance(getattr(runtime, sub), fake), sub


@pytest.mark.parametrize(("sub", "name"), sorted(sub_api_protocol_methods()))
def test_owners_and_fakes_implement_every_sub_api_method(sub: str, name: str) -> None:
    """As for the Runtime's own methods: the protocol names what the owner has, and the fake's
    stand-in has the owner's names, kinds and defaults."""
    def names_and_kinds(fn: Any) -> list[tuple[str, Any, bool]]:
        return [(p.name, p.kind, p.default is p.empty) for p in inspect.signature(fn).parameters.values()]

    owner, protocol, fake_cls = SUB_APIS[sub]
    real, declared = getattr(owner, name, None), getattr(protocol, name)
    fake = getattr(fake_cls, name, None)
    assert real is not None, f"{owner.__name__} lacks {protocol.__name__}.{name}"
    assert fake is not None, f"{fake_cls.__name__} lacks {protocol.__name__}.{name}"
    assert names_and_kinds(declared) == names_and_kinds(real), f"{protocol.__name__}.{name} drifted"
    assert shape(fake) == shape(real), f"{fake_cls.__name__}.{name} drifted from {owner.__name__}.{name}"
    for fn in (declared, fake):
        assert inspect.iscoroutinefunction(fn) == inspect.iscoroutinefunction(real), name


@pytest.mark.parametrize("name", sorted(protocol_methods()))
def test_runtime_and_fake_implement_every_protocol_method(name: str) -> None:
    """Every ``RuntimeLike`` method: ``Runtime`` has it with the same parameter names, kinds and
    required-ness, and ``FakeRuntime`` with the same names, kinds and defaults (as ``Runtime``).
    mypy checks the types of ``Runtime`` against the protocol (``forkd.api.deps``)."""
    def names_and_kinds(fn: Any) -> list[tuple[str, Any, bool]]:
        return [(p.name, p.kind, p.default is p.empty) for p in inspect.signature(fn).parameters.values()]

    protocol = getattr(RuntimeLike, name)
    real = getattr(Runtime, name, None)
    fake = getattr(FakeRuntime, name, None)
    assert real is not None, f"Runtime lacks RuntimeLike.{name}"
    assert fake is not None, f"FakeRuntime lacks RuntimeLike.{name}"
    assert names_and_kinds(protocol) == names_and_kinds(real), f"RuntimeLike.{name} drifted from Runtime"
    assert shape(fake) == shape(real), f"FakeRuntime.{name} drifted from Runtime.{name}"
    for fn in (protocol, fake):
        assert inspect.iscoroutinefunction(fn) == inspect.iscoroutinefunction(real), name


def test_mypy_accepts_the_fake_as_a_runtime_like(tmp_path: Path) -> None:
    """The types, not only the names: mypy (strict) checks FakeRuntime against the protocol, as it
    checks Runtime in forkd.api.deps."""
    pytest.importorskip("mypy")
    root = Path(__file__).resolve().parents[2]
    check = tmp_path / "check_fake.py"
    check.write_text(textwrap.dedent("""\
        from forkd.api.deps import RuntimeLike
        from tests.fakes.runtime import FakeRuntime


        def fake_is_runtime_like(runtime: FakeRuntime) -> RuntimeLike:
            return runtime
    """))
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports=silent", "--cache-dir", str(tmp_path / "cache"),
         "--config-file", str(root / "pyproject.toml"), str(check)],
        capture_output=True, text=True, timeout=300, cwd=root,
        env={**os.environ, "MYPYPATH": os.pathsep.join([str(root / "src"), str(root)])},
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_pause_resume_and_describe_behave_like_the_runtime() -> None:
    async def main() -> None:
        rt = FakeRuntime()
        rt.add_snapshot("py")
        [sb] = await rt.spawn("py", 1, SpawnOptions(metadata={"k": "v"}))
        view = rt.describe_sandbox(sb.id)
        assert (view["id"], view["template"], view["state"], view["metadata"]) == (sb.id, "py", "running",
                                                                                   {"k": "v"})
        paused = await rt.pause(sb.id)
        assert paused.state_tag == f"paused-{sb.id}-1" and paused.template == "py"
        assert sb.id not in rt.sandboxes and rt.describe_sandbox(sb.id)["state"] == "paused"
        assert [v["state"] for v in rt.describe_sandboxes()] == ["paused"]
        with pytest.raises(Conflict, match="already paused"):
            await rt.pause(sb.id)
        resumed = await rt.resume(sb.id, timeout_secs=60)
        assert (resumed.id, resumed.snapshot_tag, resumed.metadata) == (sb.id, paused.state_tag, {"k": "v"})
        assert resumed.expires_at_unix is not None
        assert rt.describe_sandbox(sb.id)["template"] == "py"  # through the auto-deleted state snapshot
        with pytest.raises(NotFound):
            await rt.resume(sb.id)
        with pytest.raises(NotFound):
            rt.describe_sandbox("sb-ffffff-0009")

    asyncio.run(main())


def test_file_move_renames_files_and_directories() -> None:
    async def main() -> None:
        rt = FakeRuntime()
        rt.add_sandbox("sb-abcdef-0000")
        await rt.files.mkdir("sb-abcdef-0000", "/a/b", parents=True)

        async def body() -> Any:
            yield b"hi"

        await rt.files.write("sb-abcdef-0000", "/a/b/f.txt", body(), max_bytes=10)
        info = await rt.files.move("sb-abcdef-0000", "/a", "/x/y")
        assert (info["path"], info["type"]) == ("/x/y", "dir")
        assert (await rt.files.stat("sb-abcdef-0000", "/x/y/b/f.txt"))["size"] == 2
        with pytest.raises(NotFound):
            await rt.files.stat("sb-abcdef-0000", "/a")
        with pytest.raises(NotFound):
            await rt.files.move("sb-abcdef-0000", "/nope", "/z")
        with pytest.raises(Conflict):
            await rt.files.move("sb-abcdef-0000", "/x", "/x/y/inside")

    asyncio.run(main())


def test_lineage_delete_and_live_branches_behave_like_the_runtime() -> None:
    async def main() -> None:
        rt = FakeRuntime()
        rt.add_snapshot("py")
        [src] = await rt.spawn("py", 1, SpawnOptions(live_fork=True))
        first = await rt.branch(src.id, mode="diff")
        assert (first.tag, first.parent_tag, first.status) == (f"branch-{src.id}-1", "py", "ready")
        live = await rt.branch(src.id, tag="cp", mode="live", wait=False)
        assert live.parent_tag == first.tag  # consecutive branches chain
        with pytest.raises(Conflict, match="still being written"):
            await rt.spawn("cp")
        assert [rt.get_snapshot("cp").status for _ in range(2)] == ["writing", "ready"]
        assert rt.snapshot_lineage("cp")["ancestors"] == [first.tag, "py"]
        with pytest.raises(Conflict, match="dependent snapshots"):
            await rt.delete_snapshot("py")
        with pytest.raises(Conflict, match="running from"):
            await rt.delete_snapshot("py", cascade=True)
        await rt.delete_snapshot("py", cascade=True, force=True)
        assert rt.snapshots == {} and rt.sandboxes == {}
        with pytest.raises(NotFound):
            await rt.kill(src.id)

    asyncio.run(main())


def test_eval_answers_arithmetic_and_reports_the_rest_as_the_agent_does() -> None:
    async def main() -> None:
        rt = FakeRuntime()
        rt.add_sandbox("sb-abcdef-0000")
        assert (await rt.eval("sb-abcdef-0000", "2 * (3 + 4)"))["result"] == "14"
        assert (await rt.eval("sb-abcdef-0000", "numpy.zeros(5).sum()"))["result"] == "0.0"
        for code in ("1 / 0", "import os", "open('/etc/passwd')"):
            res = await rt.eval("sb-abcdef-0000", code)
            assert res["result"] is None and res["exit_code"] == 1 and res["error"], code

    asyncio.run(main())
