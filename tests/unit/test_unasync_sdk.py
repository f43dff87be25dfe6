"""The sync SDK modules are generated from the async ones (scripts/unasync_sdk.py), into
src/forkd/sdk/_generated/, a folder of generated files only.

The first test fails whenever someone edits an async module without
regenerating, or edits a generated module by hand.
"""

from __future__ import annotations

import importlib.util
import inspect
import shutil
from pathlib import Path
from types import ModuleType

import pytest

import forkd.sdk as sdk

ROOT = Path(__file__).resolve().parents[2]


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("unasync_sdk", ROOT / "scripts" / "unasync_sdk.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


unasync_sdk = load_script()


def test_generated_sync_modules_are_up_to_date(capsys: pytest.CaptureFixture[str]) -> None:
    status = unasync_sdk.main(["--check"])
    out = capsys.readouterr()
    assert status == 0, f"run `python scripts/unasync_sdk.py`\n{out.out}{out.err}"


def test_generated_modules_say_so() -> None:
    for source, target in unasync_sdk.TWINS:
        first = (ROOT / target).read_text(encoding="utf-8").splitlines()[0]
        assert first == f"# GENERATED from {source.as_posix()} by scripts/unasync_sdk.py — do not edit."
    # Everything in the generated folder says so, whichever script writes it.
    folder = ROOT / unasync_sdk.GENERATED
    for path in folder.rglob("*.py"):
        first = path.read_text(encoding="utf-8").splitlines()[0]
        assert first.startswith("# GENERATED ") and first.endswith(" — do not edit."), path


def test_the_generated_folder_holds_only_generated_files() -> None:
    """Every sync twin and the models live in sdk/_generated/, and nothing else does."""
    assert unasync_sdk.strays(ROOT, unasync_sdk.wanted_files(ROOT)) == []
    for _, target in unasync_sdk.TWINS:
        assert target.is_relative_to(unasync_sdk.GENERATED)
    assert set(unasync_sdk.OTHER_WRITERS) == {unasync_sdk.GENERATED / "models.py"}
    # No generated module is left beside the hand-written ones (where they lived before).
    for name in ("client.py", "sandbox.py", "snapshot.py", "guest.py", "explore.py", "routes"):
        assert not (ROOT / unasync_sdk.SDK / name).exists(), name


def test_the_public_names_are_the_generated_modules() -> None:
    from forkd.sdk import models
    from forkd.sdk._generated import models as generated_models

    assert sdk.Controller.__module__ == "forkd.sdk._generated.client"
    assert sdk.Sandbox.__module__ == "forkd.sdk._generated.sandbox"
    assert models.SandboxInfo is generated_models.SandboxInfo
    assert models.__all__ == generated_models.__all__


def sdk_tree(tmp_path: Path) -> Path:
    """A copy of the SDK's async sources and generated modules under ``tmp_path``."""
    paths = [path for twin in unasync_sdk.TWINS for path in twin]
    for path in (*paths, unasync_sdk.GENERATED / "__init__.py", *unasync_sdk.OTHER_WRITERS):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    return tmp_path


def test_check_reports_drift_and_a_run_fixes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = sdk_tree(tmp_path)
    source, target = unasync_sdk.TWINS[1]
    text = (root / source).read_text(encoding="utf-8")
    marker = '        """Stop the VM now (whether or not this object created it)."""\n'
    assert marker in text
    (root / source).write_text(text.replace(marker, marker + "        print('drift')\n"))

    assert unasync_sdk.main(["--check"], root=root) == 1
    out = capsys.readouterr()
    assert "+        print('drift')" in out.out
    assert f"{target}: out of date with the async source" in out.err
    assert "print('drift')" not in (root / target).read_text(encoding="utf-8")  # --check writes nothing

    assert unasync_sdk.main([], root=root) == 0
    assert "print('drift')" in (root / target).read_text(encoding="utf-8")
    assert unasync_sdk.main(["--check"], root=root) == 0


def test_a_hand_edit_of_a_generated_module_is_drift(tmp_path: Path) -> None:
    root = sdk_tree(tmp_path)
    _, target = unasync_sdk.TWINS[0]
    with (root / target).open("a", encoding="utf-8") as f:
        f.write("# a hand edit\n")
    assert unasync_sdk.main(["--check"], root=root) == 1


def test_a_file_no_generator_writes_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = sdk_tree(tmp_path)
    assert unasync_sdk.main(["--check"], root=root) == 0
    stray = root / unasync_sdk.GENERATED / "routes" / "helpers.py"
    stray.write_text("def by_hand() -> None: ...\n", encoding="utf-8")

    assert unasync_sdk.main(["--check"], root=root) == 1
    assert "no generator writes src/forkd/sdk/_generated/routes/helpers.py" in capsys.readouterr().err
    assert unasync_sdk.main([], root=root) == 1  # a run writes the twins but keeps refusing it
    assert stray.exists()  # never deleted: it may be someone's work in the wrong folder
    stray.unlink()
    assert unasync_sdk.main(["--check"], root=root) == 0


def test_the_substitutions() -> None:
    source = '''import asyncio
import time

from forkd.sdk._twins import sync_property
from forkd.sdk.async_client import AsyncController


class AsyncSnapshot:
    """Wraps :class:`~forkd.sdk.async_sandbox.AsyncSandbox`."""

    async def __aenter__(self) -> AsyncSnapshot:
        async with AsyncController(transport=httpx.AsyncBaseTransport()) as c:
            async for x in c.stream():
                await asyncio.sleep(0.1)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.aclose()

    @sync_property
    async def info(self) -> str:
        return default_async_controller().url
'''
    assert unasync_sdk.unasync(source) == '''import time

from forkd.sdk._generated.client import Controller


class Snapshot:
    """Wraps :class:`~forkd.sdk._generated.sandbox.Sandbox`."""

    def __enter__(self) -> Snapshot:
        with Controller(transport=httpx.BaseTransport()) as c:
            for x in c.stream():
                time.sleep(0.1)
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()

    @property
    def info(self) -> str:
        return default_controller().url
'''


@pytest.mark.parametrize(
    "line",
    ["await asyncio.gather(a, b)", "x = AsyncNewThing()", "loop = asyncio.get_running_loop()",
     "# an async generator"],
)
def test_a_token_the_table_does_not_cover_is_an_error(line: str) -> None:
    with pytest.raises(unasync_sdk.UnasyncError, match=r"extend RULES[\s\S]*x\.py:2:"):
        unasync_sdk.generate(f"ok = 1\n{line}\n", Path("x.py"))


DUNDERS = ("__enter__", "__exit__", "__aenter__", "__aexit__")


def surface(cls: type) -> dict[str, tuple[str, str]]:
    """Each public member of ``cls``, named as in the sync API: its kind and signature."""
    out = {}
    for name in dir(cls):
        if name.startswith("_") and name not in DUNDERS:
            continue
        raw = inspect.getattr_static(cls, name)
        if isinstance(raw, property):
            assert raw.fget is not None
            kind, function = "property", raw.fget
        elif isinstance(raw, classmethod):
            kind, function = "classmethod", getattr(cls, name)
        else:
            kind, function = "method", raw
        out[unasync_sdk.unasync(name)] = (kind, unasync_sdk.unasync(str(inspect.signature(function))))
    return out


@pytest.mark.parametrize(
    ("sync", "async_"),
    [
        (sdk.Controller, sdk.AsyncController),
        (sdk.Sandbox, sdk.AsyncSandbox),
        (sdk.Snapshot, sdk.AsyncSnapshot),
        (sdk.Commands, sdk.AsyncCommands),
    ],
)
def test_twins_have_the_same_public_surface(sync: type, async_: type) -> None:
    expected = surface(async_)
    if async_ is sdk.AsyncSandbox:  # the one @sync_property
        assert expected["info"][0] == "method"
        expected["info"] = ("property", expected["info"][1])
    assert surface(sync) == expected
