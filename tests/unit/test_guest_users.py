"""Guest users without a VM: the agent's lookup and acting-as (on this host's own accounts), and the
image's ``user`` account written into a tree. Real guests: tests/integration/test_users.py."""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import tempfile
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from forkd.controller.agent_gateway import AgentGateway
from forkd.controller.sandbox_events import SandboxEvents
from forkd.errors import Conflict, InvalidRequest
from forkd.guest.agent import users
from forkd.guest.agent.reaper import Reaper
from forkd.guest.agent.spawn import parse_common, spawn
from forkd.guest.capabilities import CAP_USER
from forkd.guest.client import AgentClient
from forkd.guest.protocol import INVALID, PING, RequestError
from forkd.image import rootfs

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")


def test_lookup_reads_passwd_and_refuses_unknown_users() -> None:
    root = users.lookup("root")
    assert (root.uid, root.gid, root.home) == (0, 0, pwd.getpwnam("root").pw_dir)
    assert root.env() == {"HOME": root.home, "USER": "root", "LOGNAME": "root"}
    with pytest.raises(RequestError, match="unknown user 'no-such-user-here' in the sandbox") as exc:
        users.lookup("no-such-user-here")
    assert exc.value.kind == INVALID
    assert users.user_field({}) is None
    for bad in ("", 7, "x" * 300, "a\0b"):
        with pytest.raises(RequestError, match="'user' must be a user name"):
            users.user_field({"user": bad})


def test_a_process_spec_for_a_user_starts_in_their_home() -> None:
    spec = parse_common({"args": ["id"], "user": "root"})
    assert spec.user is not None and spec.cwd == spec.user.workdir()
    assert parse_common({"args": ["id"], "user": "root", "cwd": "/tmp"}).cwd == "/tmp"
    assert parse_common({"args": ["id"]}).user is None and parse_common({"args": ["id"]}).cwd is None


@as_root
def test_spawn_as_a_user_sets_ids_and_environment() -> None:
    nobody = pwd.getpwnam("nobody")
    spec = parse_common({"args": ["sh", "-c", "id -u; id -g; echo $USER $HOME"], "user": "nobody",
                         "cwd": "/", "env": {"EXTRA": "1"}})
    proc = spawn(spec, Reaper())
    for pipe in (proc.stdout, proc.stderr):
        assert pipe is not None
        os.set_blocking(pipe.fileno(), True)
    out, _ = proc.communicate(timeout=30)
    assert out.decode().split() == [str(nobody.pw_uid), str(nobody.pw_gid), "nobody", nobody.pw_dir]


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory anyone may enter (pytest's tmp_path sits in root's 0700 folder)."""
    path = Path(tempfile.mkdtemp(prefix="forkd-users-", dir="/tmp"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@as_root
def test_as_user_acts_on_this_thread_only_and_restores_root(open_dir: Path) -> None:
    nobody = users.lookup("nobody")
    tmp_path = open_dir
    secret = tmp_path / "secret"
    secret.write_text("root's")
    secret.chmod(0o600)
    seen: dict[str, object] = {}

    def worker() -> None:
        with users.as_user(nobody):
            (tmp_path / "theirs").write_text("x")
            try:
                secret.read_text()
                seen["read"] = True
            except PermissionError:
                seen["read"] = False
            seen["main_can_read"] = main_reads.wait(5)
        seen["after"] = secret.read_text()

    main_reads = threading.Event()
    thread = threading.Thread(target=worker)
    thread.start()
    # While the worker acts as nobody, this thread is still root.
    assert secret.read_text() == "root's"
    main_reads.set()
    thread.join()
    assert seen == {"read": False, "main_can_read": True, "after": "root's"}
    st = (tmp_path / "theirs").stat()
    assert (st.st_uid, st.st_gid) == (nobody.uid, nobody.gid)


@as_root
def test_a_user_mkdir_with_parents_under_a_root_owned_folder_gets_them(open_dir: Path) -> None:
    """E2B's envd makes a write's missing parents and hands them to the user (its EnsureDirs):
    ``/opt/new/x.txt`` as ``user`` works. The existing root-owned folder keeps its owner, and
    a user still may not make a directory directly in it, nor anywhere without ``parents``."""
    from forkd.guest.agent.files import Files

    nobody = users.lookup("nobody")
    root_owned = open_dir / "opt"
    root_owned.mkdir(mode=0o755)
    target = root_owned / "new" / "deeper"
    assert Files.mkdir({"path": str(target), "parents": True, "user": "nobody"}) == {"created": True}
    for made in (root_owned / "new", target):
        st = made.stat()
        assert (st.st_uid, st.st_gid) == (nobody.uid, nobody.gid)
    assert root_owned.stat().st_uid == 0
    # The user now writes into it as themselves.
    with users.as_user(nobody):
        (target / "x.txt").write_text("theirs")
    assert (target / "x.txt").stat().st_uid == nobody.uid
    assert Files.mkdir({"path": str(target), "parents": True, "user": "nobody"}) == {"created": False}
    with pytest.raises(RequestError) as refused:
        Files.mkdir({"path": str(root_owned / "other"), "user": "nobody"})
    assert refused.value.kind == INVALID and not (root_owned / "other").exists()
    (root_owned / "file").write_text("")
    with pytest.raises(RequestError, match="Not a directory"):
        Files.mkdir({"path": str(root_owned / "file" / "sub"), "parents": True, "user": "nobody"})


def test_add_user_writes_the_account_once(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    (etc / "sudoers.d").mkdir(parents=True)
    (etc / "skel").mkdir()
    (etc / "skel" / ".bashrc").write_text("# bash\n")
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (etc / "group").write_text("root:x:0:\n")
    (etc / "shadow").write_text("root:*:19000:0:99999:7:::\n")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "bash").write_text("")
    rootfs.add_user(tmp_path)
    rootfs.add_user(tmp_path)  # the cached tree is built on again: nothing twice
    assert (etc / "passwd").read_text().splitlines()[1:] == ["user:x:1000:1000::/home/user:/bin/bash"]
    assert (etc / "group").read_text().splitlines()[1:] == ["user:x:1000:"]
    assert (etc / "shadow").read_text().splitlines()[1].startswith("user:!:")
    home = tmp_path / "home" / "user"
    assert (home / ".bashrc").read_text() == "# bash\n"
    if os.geteuid() == 0:
        assert (home.stat().st_uid, (home / ".bashrc").stat().st_gid) == (1000, 1000)
    rule = etc / "sudoers.d" / "forkd-user"
    assert rule.read_text() == "user ALL=(ALL:ALL) NOPASSWD: ALL\n" and rule.stat().st_mode & 0o777 == 0o440


def test_add_user_keeps_an_existing_user_and_refuses_a_taken_uid(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "passwd").write_text("user:x:1000:1000::/srv/user:/bin/sh\n")
    (tmp_path / "srv" / "user").mkdir(parents=True)
    rootfs.add_user(tmp_path)
    assert (etc / "passwd").read_text() == "user:x:1000:1000::/srv/user:/bin/sh\n"
    assert not (etc / "sudoers.d").exists()  # no sudo in the tree: no rule
    (etc / "passwd").write_text("ubuntu:x:1000:1000::/home/ubuntu:/bin/sh\n")
    with pytest.raises(InvalidRequest, match="uid 1000 is 'ubuntu'"):
        rootfs.add_user(tmp_path)


class _VM:
    """A VM as the gateway's capability cache sees it: an identity (weakly referenced)."""


class _Ids:
    """The table as ``require_agent`` asks it: every id stands for itself."""

    def resolve(self, sandbox_id: str) -> str:
        return sandbox_id


def test_an_older_agent_is_refused_before_it_could_ignore_user() -> None:
    """A snapshot from an older forkd has an agent that ignores ``user`` (it would run as root):
    the host asks its version once per VM and refuses with a 409 that says what to do."""
    pings: list[str] = []
    version = {"v": "6"}
    vm = _VM()
    table = AgentGateway(_Ids(), SandboxEvents())  # type: ignore[arg-type]

    async def for_call(sandbox_id: str) -> object:
        return vm

    async def ping(timeout: float) -> dict[str, object]:
        pings.append(PING)
        return {"pong": True, "agent_version": version["v"]}

    async def call(sandbox_id: str, ask: Callable[[Any], Awaitable[Any]]) -> Any:
        # The gateway's typed call, on an agent of that version (``AgentClient.capabilities``).
        return await ask(SimpleNamespace(capabilities=lambda timeout: AgentClient.capabilities(
            SimpleNamespace(ping=ping), timeout)))  # type: ignore[arg-type]

    table.for_call = for_call  # type: ignore[method-assign,assignment]
    table.call = call  # type: ignore[method-assign]
    with pytest.raises(Conflict, match="version 6, which predates acting as a user: create its snapshot"):
        asyncio.run(table.require_agent("sb-1", CAP_USER))
    version["v"] = "7"
    with pytest.raises(Conflict):  # known for this VM: not asked again
        asyncio.run(table.require_agent("sb-1", CAP_USER))
    assert pings == [PING]
    vm = _VM()  # a new VM under the id (a resume): asked again
    asyncio.run(table.require_agent("sb-1", CAP_USER))
    assert pings == [PING, PING]
