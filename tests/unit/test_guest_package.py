"""The guest agent as the image ships it: stdlib only, importable by the oldest Python
it claims (``MIN_GUEST_PYTHON``), installed whole, and covered by the image's cache key.

The interpreter tests run real interpreters in isolated mode (``-I -S``: no
site-packages, no environment, no script directory), on the files exactly as
``rootfs.install_agent`` lays them out in the guest.
"""

from __future__ import annotations

import ast
import base64
import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import forkd.guest.agent
from forkd.errors import InvalidRequest
from forkd.guest import messages, protocol
from forkd.guest.agent import MIN_GUEST_PYTHON
from forkd.image import builder, initramfs, rootfs

PACKAGE_DIR = Path(forkd.guest.agent.__file__).parent
VERSION_OF = "import sys; print('%d.%d' % sys.version_info[:2])"


def _version(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([python, "-I", "-S", "-c", VERSION_OF], capture_output=True, text=True,
                             timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    major, minor = out.strip().split(".")
    return int(major), int(minor)


def _interpreters() -> dict[tuple[int, int], str]:
    """Real python3 interpreters on this machine, by version (not the venv's)."""
    candidates = ["/usr/bin/python3", *sorted(glob.glob("/usr/bin/python3.[0-9]*"))]
    candidates += [p for n in range(6, 20) if (p := shutil.which(f"python3.{n}"))]
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    candidates += sorted(glob.glob(f"{pyenv}/versions/3.*/bin/python3"))
    found: dict[tuple[int, int], str] = {}
    for path in candidates:
        if path.endswith("-config") or not os.access(path, os.X_OK):
            continue
        version = _version(path)
        if version is not None:
            found.setdefault(version, path)
    return found


@pytest.fixture(scope="module")
def interpreters() -> dict[tuple[int, int], str]:
    return _interpreters()


@pytest.fixture(scope="module")
def guest_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("guest-root")
    rootfs.install_agent(root)
    return root


# Run as separate processes with the guest's python3 (forkd.guest.agent.kernels starts the runner,
# the runner the kernels), never imported by the agent: the files that may import more than the
# stdlib, each only this.
HELPERS = {
    "forkd/guest/agent/kernel_runner.py": set(),
    "forkd/guest/agent/kernel_client.py": {"jupyter_client"},
    "forkd/guest/agent/kernel_wrap.py": {"ipykernel"},
    "forkd/guest/agent/kernel_bash.py": set(),
    "forkd/guest/agent/kernel_js.py": set(),
}
HELPER_MODULES = {rel[: -len(".py")].replace("/", ".") for rel in HELPERS}


def _agent_modules() -> list[str]:
    """The modules the agent may import (not the helpers it runs as processes)."""
    names = ["forkd.guest.protocol", "forkd.guest.messages"]
    for rel in rootfs.agent_files():
        if rel.startswith("forkd/guest/agent/") and rel.endswith(".py") and rel not in HELPERS:
            names.append(rel[: -len(".py")].replace("/", ".").removesuffix(".__init__"))
    return names


# ------------------------------------------------------------------ the oldest Python


def test_agent_runs_under_the_oldest_python_it_claims(
    interpreters: dict[tuple[int, int], str], guest_root: Path
) -> None:
    """Every module imports under MIN_GUEST_PYTHON with no site-packages, and the agent serves."""
    python = interpreters.get(MIN_GUEST_PYTHON)
    if python is None:
        pytest.skip(f"no Python {'.'.join(map(str, MIN_GUEST_PYTHON))} interpreter on this machine "
                    f"(looked in /usr/bin, PATH and pyenv; found {sorted(interpreters)})")
    agent_root = str(guest_root / rootfs.AGENT_GUEST_ROOT)
    check = (
        "import importlib, sys, sysconfig\n"
        f"sys.path.insert(0, {agent_root!r})\n"
        f"for name in {_agent_modules()!r}:\n"
        "    importlib.import_module(name)\n"
        "stdlib = (sysconfig.get_paths()['stdlib'], sysconfig.get_paths()['platstdlib'])\n"
        "for name, module in sorted(sys.modules.items()):\n"
        "    path = getattr(module, '__file__', None) or ''\n"
        f"    assert not path or path.startswith(({agent_root!r},) + stdlib), (name, path)\n"
        f"for rel in {sorted(HELPERS)!r}:\n"  # the helpers import more, but parse under it too
        f"    compile(open({agent_root!r} + '/' + rel).read(), rel, 'exec')\n"
        "print('%d.%d' % sys.version_info[:2])\n"
    )
    proc = subprocess.run([python, "-I", "-S", "-c", check], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ".".join(map(str, MIN_GUEST_PYTHON))

    _check_serves(python, guest_root, MIN_GUEST_PYTHON)


def _check_serves(python: str, guest_root: Path, version: tuple[int, int]) -> None:
    """The agent serves under ``python``, started (isolated) by the path init.sh uses."""
    requests = [
        {"id": 1, "action": "ping"},
        {"id": 2, "action": "exec", "args": ["echo", "hi"]},
        {"id": 3, "action": "eval", "code": "while True: pass", "timeout_secs": 0.3},
        {"id": 4, "action": "eval", "code": "6 * 7"},
    ]
    data = b"".join(protocol.encode(r) for r in requests)
    proc = subprocess.run([python, "-I", "-S", "-u", str(guest_root / rootfs.AGENT_ENTRY), "--stdio"],
                          input=data, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    messages = list(map(json.loads, proc.stdout.splitlines()))
    replies = {r["id"]: r for r in messages if "event" not in r}
    assert replies[1]["result"]["python_version"].startswith(f"{version[0]}.{version[1]}.")
    output = [m["event"] for m in messages if "event" in m and m["id"] == 2]
    assert output == [{"type": "stdout", "data": base64.b64encode(b"hi\n").decode()}]
    assert replies[2]["result"]["exit_code"] == 0
    assert replies[3]["result"]["error"] == "TimeoutError: eval exceeded 0.3 s"
    assert replies[4]["result"]["result"] == "42"


def test_agent_serves_under_newer_pythons(
    interpreters: dict[tuple[int, int], str], guest_root: Path
) -> None:
    """Custom images may ship a newer python3; the eval timeout relies on CPython internals."""
    newer = sorted(v for v in interpreters if v > MIN_GUEST_PYTHON)
    if not newer:
        pytest.skip("no Python newer than MIN_GUEST_PYTHON on this machine")
    for version in newer:
        _check_serves(interpreters[version], guest_root, version)


def test_an_older_python_is_refused_with_a_message(
    interpreters: dict[tuple[int, int], str], guest_root: Path
) -> None:
    older = sorted(v for v in interpreters if (3, 6) <= v < MIN_GUEST_PYTHON)
    if not older:
        pytest.skip(f"no Python 3.6 to {MIN_GUEST_PYTHON} (exclusive) on this machine to check the refusal")
    for version in older:
        proc = subprocess.run(
            [interpreters[version], "-I", "-S", "-u", str(guest_root / rootfs.AGENT_ENTRY), "--stdio"],
            input=b"", capture_output=True, timeout=60,
        )
        wanted = ".".join(map(str, MIN_GUEST_PYTHON))
        assert proc.returncode == 1, (version, proc.stderr.decode())
        assert proc.stderr.decode().startswith(f"forkd-agent: needs Python {wanted} or newer"), version
        assert "Traceback" not in proc.stderr.decode()


def test_min_python_is_what_the_default_image_ships() -> None:
    assert builder.ImageRecipe().suite == "bookworm"  # Debian 12: python3 is 3.11
    assert MIN_GUEST_PYTHON == (3, 11)


# ------------------------------------------------------------------- stdlib only


def _imports(tree: ast.AST) -> list[tuple[str, list[str]]]:
    """(module, names) of every import in a module, at any depth (TYPE_CHECKING ones too)."""
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative imports: keep them absolute, so the check holds"
            found.append((node.module or "", [alias.name for alias in node.names]))
    return found


def test_agent_package_imports_only_the_stdlib_and_itself() -> None:
    files = rootfs.agent_files()
    own = {rel[: -len(".py")].replace("/", ".").removesuffix(".__init__") for rel in files}
    for rel, data in files.items():
        if not rel.endswith(".py"):
            continue
        for module, names in _imports(ast.parse(data, rel)):
            top = module.split(".")[0]
            if rel not in HELPERS:
                imported = {module, *(f"{module}.{n}" for n in names)}
                assert not imported & HELPER_MODULES, f"{rel} imports a helper ({module})"
            if top in HELPERS.get(rel, ()):
                continue
            if top in sys.stdlib_module_names and top != "forkd":
                continue
            assert module in own, f"{rel} imports {module}, which is neither stdlib nor the agent's"
            for name in names:  # `from forkd.guest import protocol`: a module, or a name in one
                assert f"{module}.{name}" in own or module in own, f"{rel}: from {module} import {name}"


def test_every_agent_module_says_why() -> None:
    for path in sorted(PACKAGE_DIR.glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc and len(doc.split()) >= 8, f"{path.name} needs a docstring saying why it exists"
        assert len(path.read_text().splitlines()) <= 250, f"{path.name} is no longer small"


# ---------------------------------------------------------------- install and cache key


def test_agent_files_are_the_whole_package_and_the_protocol() -> None:
    on_disk = {
        f"forkd/guest/agent/{p.relative_to(PACKAGE_DIR).as_posix()}"
        for p in PACKAGE_DIR.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    }
    files = rootfs.agent_files()
    assert on_disk <= set(files)
    shared = {f"forkd/guest/{name}" for name in rootfs.GUEST_SHARED_MODULES}
    assert set(files) - on_disk == {"forkd/__init__.py", "forkd/guest/__init__.py"} | shared
    assert {"forkd/guest/protocol.py", "forkd/guest/messages.py"} <= shared
    assert files["forkd/guest/protocol.py"] == Path(protocol.__file__).read_bytes()
    assert files["forkd/guest/messages.py"] == Path(messages.__file__).read_bytes()
    assert list(files) == sorted(files)


def test_agent_digest_covers_every_file_in_a_stable_order() -> None:
    files = rootfs.agent_files()
    digest = rootfs.agent_digest(files)
    assert digest == rootfs.agent_digest() == rootfs.agent_digest(dict(reversed(files.items())))
    for rel, data in files.items():
        changed = dict(files, **{rel: data + b"\n"})
        assert rootfs.agent_digest(changed) != digest, f"a change to {rel} would not rebuild the image"
        renamed = {(rel + "x" if k == rel else k): v for k, v in files.items()}
        assert rootfs.agent_digest(renamed) != digest
    assert rootfs.agent_digest(dict(files, **{"forkd/guest/agent/new.py": b""})) != digest
    # Paths and contents are framed: moving bytes from one to the other changes the digest.
    assert rootfs.agent_digest({"a": b"bc"}) != rootfs.agent_digest({"ab": b"c"})


def test_image_key_follows_the_agent_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = builder.ImageRecipe(mirror="http://deb.example/debian")
    key = recipe.key()
    assert recipe.key() == key
    monkeypatch.setattr(rootfs, "agent_digest", lambda files=None: "0" * 64)
    assert recipe.key() != key


def test_install_agent_lays_out_the_package(tmp_path: Path) -> None:
    stale = tmp_path / rootfs.AGENT_GUEST_ROOT / "agent.py"  # the one-file agent of older images
    stale.parent.mkdir(parents=True)
    stale.write_text("old")
    rootfs.install_agent(tmp_path)
    assert not stale.exists()
    base = tmp_path / rootfs.AGENT_GUEST_ROOT
    for rel, data in rootfs.agent_files().items():
        assert (base / rel).read_bytes() == data
    assert (tmp_path / rootfs.AGENT_ENTRY).is_file()
    assert (tmp_path / "etc" / "hostname").read_text() == "forkd\n"
    # The guest's forkd package is a stub: the host's __init__ imports what the guest lacks.
    assert (base / "forkd" / "__init__.py").read_bytes() == rootfs.GUEST_PACKAGE_STUB


def test_init_script_starts_the_installed_entry_point() -> None:
    script = initramfs.init_script().decode()
    assert f"agent=/{rootfs.AGENT_ENTRY} " in script
    assert 'exec switch_root /newroot /usr/bin/python3 -u "$agent"' in script


def _fake_python(root: Path, version: str, *, link: bool = True) -> None:
    bindir = root / "usr" / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    (bindir / f"python{version}").write_bytes(b"\x7fELF")
    if link:
        (bindir / "python3").symlink_to(f"python{version}")
    lib = root / "usr" / "lib" / f"python{version}"
    lib.mkdir(parents=True, exist_ok=True)
    (lib / "os.py").write_text("")


def test_guest_python_version(tmp_path: Path) -> None:
    assert rootfs.guest_python_version(tmp_path) is None
    _fake_python(tmp_path / "linked", "3.12")
    assert rootfs.guest_python_version(tmp_path / "linked") == (3, 12)
    _fake_python(tmp_path / "plain", "3.10", link=False)  # no symlink: the stdlib folder tells
    assert rootfs.guest_python_version(tmp_path / "plain") == (3, 10)
    absolute = tmp_path / "absolute"
    _fake_python(absolute, "3.11", link=False)
    (absolute / "usr" / "bin" / "python3").symlink_to("/usr/bin/python3.11")  # read inside the tree
    assert rootfs.guest_python_version(absolute) == (3, 11)


def test_install_agent_refuses_an_older_python(tmp_path: Path) -> None:
    _fake_python(tmp_path, "3.9")
    with pytest.raises(InvalidRequest, match=r"python3 is 3\.9; the forkd agent needs Python 3\.11 or newer"):
        rootfs.install_agent(tmp_path)
    assert not (tmp_path / rootfs.AGENT_ENTRY).exists()
