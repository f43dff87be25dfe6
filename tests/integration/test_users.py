"""The guest's user account in a real sandbox: commands, processes and files as ``user``
(uid 1000, home /home/user) through the runtime, root as the default, unknown users refused.

It forks from the session's one template (``snapshot``), so it boots nothing of its own.
The daemon's routes and the E2B layer over a real daemon are in test_compat_clients.py.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from forkd.controller.runtime import Runtime
from forkd.errors import InvalidRequest

from .conftest import Loop

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def sandbox(loop: Loop, runtime: Runtime, snapshot: str) -> Iterator[str]:
    [record] = loop.run(runtime.spawn(snapshot, 1))
    yield record.id
    loop.run(runtime.kill(record.id))


async def one_piece(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def read_all(runtime: Runtime, sandbox_id: str, path: str, user: str | None = None) -> bytes:
    _, stream = await runtime.files.open_read(sandbox_id, path, user=user)
    return b"".join([chunk async for chunk in stream])


PROBE = ["python3", "-c", "import json, os; print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), "
         "'groups': os.getgroups(), 'home': os.environ.get('HOME'), 'user': os.environ.get('USER'), "
         "'logname': os.environ.get('LOGNAME'), 'cwd': os.getcwd()}))"]


def test_exec_as_user_and_root_by_default(loop: Loop, runtime: Runtime, sandbox: str) -> None:
    as_user = json.loads(loop.run(runtime.exec(sandbox, PROBE, user="user"))["stdout"])
    assert as_user == {"uid": 1000, "gid": 1000, "groups": [1000], "home": "/home/user", "user": "user",
                       "logname": "user", "cwd": "/home/user"}
    # Without a user: root in the agent's own environment, as before.
    default = json.loads(loop.run(runtime.exec(sandbox, PROBE))["stdout"])
    assert (default["uid"], default["gid"], default["cwd"]) == (0, 0, "/root")
    # Root named: root's login environment.
    root = json.loads(loop.run(runtime.exec(sandbox, PROBE, user="root"))["stdout"])
    assert (root["uid"], root["home"], root["cwd"], root["user"]) == (0, "/root", "/root", "root")
    # A cwd and env given win over the user's defaults.
    moved = json.loads(loop.run(runtime.exec(sandbox, PROBE, user="user", cwd="/tmp",
                                             env={"HOME": "/tmp"}))["stdout"])
    assert (moved["uid"], moved["cwd"], moved["home"]) == (1000, "/tmp", "/tmp")
    # The account's powers: its own home, no root's, and sudo without a password.
    out = loop.run(runtime.exec(sandbox, ["sh", "-c", "touch /root/x; echo $?; sudo -n id -u"], user="user"))
    assert out["stdout"].split() == ["1", "0"], out


def test_the_default_image_has_what_e2bs_base_template_has(loop: Loop, runtime: Runtime,
                                                         sandbox: str) -> None:
    """git, curl and CA certificates, as E2B's base template: an E2B program that clones a repository
    or calls an HTTP API runs unchanged (here without a network: a local repository and a file URL)."""
    script = ("set -e; cd /tmp; rm -rf origin copy; git init -q origin; cd origin; "
              "git -c user.name=u -c user.email=u@x commit -q --allow-empty -m first; cd ..; "
              "git clone -q origin copy; git -C copy log --format=%s; "
              "curl -sS file:///etc/hostname >/dev/null && echo curl-ok; "
              "test -s /etc/ssl/certs/ca-certificates.crt && echo cas-ok")
    out = loop.run(runtime.exec(sandbox, ["bash", "-c", script], user="user"))
    assert (out["exit_code"], out["stdout"].split()) == (0, ["first", "curl-ok", "cas-ok"]), out


def test_processes_run_as_user(loop: Loop, runtime: Runtime, sandbox: str) -> None:
    info = loop.run(runtime.processes.start(sandbox, ["sleep", "30"], user="user", tag="as-user"))
    try:
        assert info["user"] == "user" and info["cwd"] == "/home/user"
        out = loop.run(runtime.exec(sandbox, ["stat", "-c", "%u", f"/proc/{info['pid']}"]))
        assert out["stdout"].strip() == "1000"
    finally:
        loop.run(runtime.processes.kill(sandbox, info["pid"]))

    async def streamed() -> bytes:
        events = await runtime.processes.run(sandbox, ["id", "-un"], user="user")
        return b"".join([ev.data async for ev in events if ev.type == "stdout"])

    assert loop.run(streamed()) == b"user\n"


def test_files_as_user_are_theirs(loop: Loop, runtime: Runtime, sandbox: str) -> None:
    made = loop.run(runtime.files.mkdir(sandbox, "/home/user/proj/src", parents=True, user="user"))
    assert made["created"]
    info = loop.run(runtime.files.write(sandbox, "/home/user/proj/src/a.txt", one_piece(b"mine"),
                                       max_bytes=1 << 20, user="user"))
    assert (info["owner"], info["group"]) == ("user", "user")
    out = loop.run(runtime.exec(sandbox, ["stat", "-c", "%u:%g %a", "/home/user/proj", "/home/user/proj/src",
                                          "/home/user/proj/src/a.txt"]))
    assert out["stdout"].split("\n")[:3] == ["1000:1000 755", "1000:1000 755", "1000:1000 644"], out
    assert loop.run(read_all(runtime, sandbox, "/home/user/proj/src/a.txt", user="user")) == b"mine"
    listing = loop.run(runtime.files.list(sandbox, "/home/user/proj/src", user="user"))
    assert [(e["name"], e["owner"], e["group"]) for e in listing["entries"]] == [("a.txt", "user", "user")]
    # Root writes root's files, and reads what the user cannot.
    rooted = loop.run(runtime.files.write(sandbox, "/tmp/root-only", one_piece(b"secret"), max_bytes=64,
                                         mode=0o600))
    assert rooted["owner"] == "root"
    with pytest.raises(InvalidRequest, match="Permission denied") as denied:
        loop.run(read_all(runtime, sandbox, "/tmp/root-only", user="user"))
    assert denied.value.status == 400
    with pytest.raises(InvalidRequest, match="Permission denied"):
        loop.run(runtime.files.write(sandbox, "/root/nope.txt", one_piece(b"x"), max_bytes=64, user="user"))
    with pytest.raises(InvalidRequest, match="Permission denied"):
        loop.run(runtime.files.mkdir(sandbox, "/etc/nope", user="user"))
    loop.run(runtime.files.remove(sandbox, "/home/user/proj", recursive=True, user="user"))
    # The agent's worker threads are root again after acting as the user.
    assert loop.run(read_all(runtime, sandbox, "/tmp/root-only")) == b"secret"


def test_the_agent_makes_a_users_missing_parents_under_a_root_owned_folder(
        loop: Loop, runtime: Runtime, sandbox: str) -> None:
    """E2B's envd rule (its EnsureDirs) on a real guest: ``mkdir(parents)`` as ``user`` under
    root-owned ``/opt`` and ``/`` makes the missing folders, each the user's; the user then
    writes into them. Run with this tree's agent code, shipped into the guest (the session's
    image may carry an older agent; a template built by this tree runs the same code)."""
    src = Path(__file__).resolve().parents[2] / "src" / "forkd" / "guest"
    shipped = {"forkd/__init__.py": b"", "forkd/guest/__init__.py": b"",
               "forkd/guest/protocol.py": (src / "protocol.py").read_bytes(),
               **{f"forkd/guest/agent/{f.name}": f.read_bytes() for f in (src / "agent").glob("*.py")}}
    for name, data in shipped.items():
        loop.run(runtime.files.mkdir(sandbox, posixpath.dirname(f"/tmp/tree/{name}"), parents=True))
        loop.run(runtime.files.write(sandbox, f"/tmp/tree/{name}", one_piece(data), max_bytes=1 << 20))
    call = ("import json, sys; sys.path.insert(0, '/tmp/tree'); from forkd.guest.agent.files import Files; "
            "print(json.dumps([Files.mkdir({'path': p, 'parents': True, 'user': 'user'}) "
            "for p in ('/opt/new/deeper', '/0')]))")
    out = loop.run(runtime.exec(sandbox, ["python3", "-c", call]))
    assert out["exit_code"] == 0, out
    assert json.loads(out["stdout"]) == [{"created": True}, {"created": True}]
    writes = "echo hi > /opt/new/deeper/x.txt && echo hi > /0/x.txt"
    out = loop.run(runtime.exec(sandbox, ["sh", "-c", writes], user="user"))
    assert out["exit_code"] == 0, out
    out = loop.run(runtime.exec(sandbox, ["stat", "-c", "%U:%G", "/opt", "/opt/new", "/opt/new/deeper",
                                          "/opt/new/deeper/x.txt", "/0", "/0/x.txt"]))
    assert out["stdout"].split() == ["root:root"] + ["user:user"] * 5, out
    loop.run(runtime.exec(sandbox, ["rm", "-rf", "/opt/new", "/0", "/tmp/tree"]))


def test_unknown_user_is_a_clear_400(loop: Loop, runtime: Runtime, sandbox: str) -> None:
    for call in (runtime.exec(sandbox, ["true"], user="nobody-here"),
                 runtime.processes.start(sandbox, ["true"], user="nobody-here"),
                 runtime.files.stat(sandbox, "/tmp", user="nobody-here")):
        with pytest.raises(InvalidRequest, match="unknown user 'nobody-here' in the sandbox") as exc:
            loop.run(call)
        assert exc.value.status == 400
    with pytest.raises(InvalidRequest, match="invalid user"):
        loop.run(runtime.exec(sandbox, ["true"], user="../etc"))
