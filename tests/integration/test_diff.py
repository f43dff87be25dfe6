"""Keep what won, on real VMs and a real project: more-itertools 10.5.0 built from its PyPI sdist
(downloaded here, uploaded into the guest: the guest has no network), broken in a parent, forked
into four children that each try a different edit. The winner's diff names exactly its file, its
patch applies with ``patch -p1`` outside, applying it to the running parent makes the project's
tests pass there, and a conflicting apply changes nothing and names the file."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from forkd.controller.applies import ApplyConflict
from forkd.controller.options import ForkOptions
from forkd.controller.runtime import Runtime

from .conftest import Loop

pytestmark = pytest.mark.vm

PROJECT = "more-itertools-10.5.0"
ROOT = f"/work/{PROJECT}"
MORE = f"{ROOT}/more_itertools/more.py"
GOOD = "    return sum(compress(repeat(1), zip(iterable)))\n"
BROKEN = "    return sum(compress(repeat(1), zip(iterable))) + 1\n"
TESTS = ["python3", "-m", "unittest", "-q", "tests.test_more.IlenTests"]


@pytest.fixture(scope="session")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """more-itertools' sdist from PyPI, once a session (FORKD_TEST_CACHE keeps it across sessions)."""
    cache = Path(os.environ.get("FORKD_TEST_CACHE") or tmp_path_factory.mktemp("pypi"))
    found = sorted(cache.glob("more[-_]itertools-10.5.0.tar.gz"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                        "more-itertools==10.5.0", "-d", str(cache)], check=True, timeout=300)
        found = sorted(cache.glob("more[-_]itertools-10.5.0.tar.gz"))
    return found[0]


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _sh(loop: Loop, runtime: Runtime, sandbox_id: str, script: str, *, cwd: str = ROOT) -> dict[str, object]:
    return dict(loop.run(runtime.exec(sandbox_id, ["sh", "-c", script], cwd=cwd, timeout_secs=120)))


def _edit(old: str, new: str, path: str = MORE) -> str:
    """A shell line replacing the line ``old`` with ``new`` in ``path`` (python: no sed quoting)."""
    code = (f"import pathlib; p = pathlib.Path({path!r}); t = p.read_text(); "
            f"assert {old!r} in t; p.write_text(t.replace({old!r}, {new!r}, 1))")
    return f"python3 -c {_quote(code)}"


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def test_keep_what_won(loop: Loop, runtime: Runtime, snapshot: str, sdist: Path, tmp_path: Path) -> None:
    [parent] = loop.run(runtime.spawn(snapshot, 1))
    children: list[str] = []
    try:
        data = sdist.read_bytes()
        loop.run(runtime.files.mkdir(parent.id, "/work", parents=True))
        loop.run(runtime.files.write(parent.id, "/work/src.tar.gz", _chunks(data), max_bytes=len(data)))
        unpack = f"tar xzf /work/src.tar.gz && rm /work/src.tar.gz && cd {PROJECT} && {_edit(GOOD, BROKEN)}"
        out = _sh(loop, runtime, parent.id, unpack, cwd="/work")
        assert out["exit_code"] == 0, out
        assert _sh(loop, runtime, parent.id, " ".join(TESTS))["exit_code"] != 0  # broken
        # A fork pauses the parent and cuts its disk: what is still in its page cache is not on
        # the snapshot's disk (docs/BRANCHING.md, "Keep what won"). sync first, as a user would.
        assert _sh(loop, runtime, parent.id, "sync")["exit_code"] == 0

        report = loop.run(runtime.fork(parent.id, 4, ForkOptions()))
        assert report.errors == []
        children = [c.id for c in report.children]
        attempts = [
            _edit(BROKEN, GOOD),  # the fix
            _edit(BROKEN, "    return sum(1 for _ in iterable) + 1\n") + " && echo x > "
            "more_itertools/helper.py",
            _edit("def roundrobin", "def roundrobin", f"{ROOT}/more_itertools/recipes.py") + " && echo >> "
            "more_itertools/recipes.py",
            "echo notes > NOTES.txt && rm docs/make.bat",
        ]
        for child, script in zip(children, attempts, strict=True):
            assert _sh(loop, runtime, child, script)["exit_code"] == 0
        passed = [c for c in children if _sh(loop, runtime, c, " ".join(TESTS))["exit_code"] == 0]
        assert passed == [children[0]]
        winner, rival = children[0], children[1]

        # Its diff names exactly its file (the tests' __pycache__ is left out by default).
        diff = loop.run(runtime.diffs.diff(winner))
        assert (diff["added"], diff["deleted"]) == ([], [])
        assert [c["path"] for c in diff["modified"]] == [MORE]
        assert diff["modified"][0]["content_changed"]
        assert diff["against"] == f"snapshot:{report.snapshot_tag}"
        other = loop.run(runtime.diffs.diff(children[3]))
        assert [c["path"] for c in other["added"]] == [f"{ROOT}/NOTES.txt"]
        assert [c["path"] for c in other["deleted"]] == [f"{ROOT}/docs/make.bat"]
        siblings = loop.run(runtime.diffs.diff(winner, f"sandbox:{children[3]}"))
        assert {c["path"] for c in siblings["added"] + siblings["modified"] + siblings["deleted"]} == {
            MORE, f"{ROOT}/NOTES.txt", f"{ROOT}/docs/make.bat"}

        # Its patch applies with patch -p1 outside, onto the same broken tree.
        patch = loop.run(runtime.diffs.render(winner, "parent", "patch", include=[ROOT]))
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            archive.extractall(tmp_path, filter="data")
        outside = tmp_path / PROJECT / "more_itertools" / "more.py"
        outside.write_text(outside.read_text().replace(GOOD, BROKEN, 1))
        root = tmp_path / "root"
        (root / "work").mkdir(parents=True)
        (tmp_path / PROJECT).rename(root / "work" / PROJECT)
        done = subprocess.run(["patch", "-p1", "-d", str(root)], input=patch, capture_output=True, timeout=60)
        assert done.returncode == 0, done
        assert GOOD in (root / "work" / PROJECT / "more_itertools" / "more.py").read_text()

        # The parent goes on meanwhile; applying the winner makes its test suite pass.
        assert _sh(loop, runtime, parent.id, "echo more >> README.rst")["exit_code"] == 0
        applied = loop.run(runtime.diffs.apply(parent.id, winner))
        assert applied["written"] == [MORE] and applied["deleted"] == []
        full = _sh(loop, runtime, parent.id, "python3 -m unittest -q tests.test_more 2>&1 | tail -3")
        assert _sh(loop, runtime, parent.id, " ".join(TESTS))["exit_code"] == 0, full

        # The rival changed the same file differently: named, and nothing of it written.
        with pytest.raises(ApplyConflict, match=r"more_itertools/more\.py"):
            loop.run(runtime.diffs.apply(parent.id, rival))
        after = _sh(loop, runtime, parent.id,
                    f"grep -c 'zip(iterable)))$' {MORE} && test ! -e more_itertools/helper.py")
        assert after["exit_code"] == 0, after
    finally:
        for sandbox_id in (*children, parent.id):
            loop.run(runtime.kill(sandbox_id))
