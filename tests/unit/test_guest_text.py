"""Strings on their way to the guest are text it can take: issue 38, LOW 10.

A lone surrogate (a JSON ``"\\ud800"`` escape) has no UTF-8 form, and NUL ends every C string: in
exec or process stdin, env, argv or cwd they were a 500/502 with a UnicodeEncodeError from deep in
the guest call. Now each is a 400 naming the field (E2B: ``invalid_argument``), before the runtime
is called.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from forkd import bounds
from forkd.api.e2b.tokens import AccessTokens
from forkd.errors import InvalidRequest
from tests.fakes.app import AUTH, TOKEN, Daemon, daemon_app

SB = "{sb}"  # the sandbox's id, in a path
LONE = "\ud800"


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with daemon_app(tmp_path, headers=AUTH, snapshots=("base",)) as d:
        yield d


@pytest.fixture
def sb(daemon: Daemon) -> str:
    return daemon.sandbox("base").id


@pytest.fixture
def client(daemon: Daemon) -> TestClient:
    return daemon.client


def envd(sb: str) -> dict[str, str]:
    return {"E2b-Sandbox-Id": sb, "E2b-Sandbox-Port": "49983",
            "X-Access-Token": AccessTokens(TOKEN.encode()).envd(sb)}


def post_json(client: TestClient, path: str, body: dict[str, Any], **headers: str) -> Any:
    # json.dumps keeps a lone surrogate as its \ud800 escape, as a hostile client sends it.
    return client.post(path, content=json.dumps(body),
                       headers={"Content-Type": "application/json", **headers})


V1 = [
    (f"/v1/sandboxes/{SB}/exec", {"args": ["cat"], "stdin": f"a{LONE}"}, "stdin"),
    (f"/v1/sandboxes/{SB}/exec", {"args": ["true"], "env": {"A": LONE}}, "env.A"),
    (f"/v1/sandboxes/{SB}/exec", {"args": ["echo", "\udcff"]}, "args[1]"),
    (f"/v1/sandboxes/{SB}/exec", {"args": ["true"], "cwd": f"/{LONE}"}, "cwd"),
    (f"/v1/sandboxes/{SB}/exec/stream", {"args": ["cat"], "stdin": LONE}, "stdin"),
    (f"/v1/sandboxes/{SB}/processes", {"args": ["cat"], "stdin": LONE}, "stdin"),
    (f"/v1/sandboxes/{SB}/processes", {"args": ["cat"], "env": {LONE: "x"}}, "env.\\ud800 (its name)"),
    (f"/v1/sandboxes/{SB}/processes/101/stdin", {"data": LONE}, "data"),
    ("/v1/sandboxes", {"snapshot_tag": "base", "env": {"A": LONE}}, "env.A"),
    ("/v1/sandboxes", {"snapshot_tag": "base", "metadata": {"k": LONE}}, "metadata.k"),
    ("/v1/sandboxes", {"snapshot_tag": "base", "child_env": [{"A": "ok"}, {"B": LONE}], "n": 2},
     "child_env[1].B"),
]


@pytest.mark.parametrize(("path", "body", "field"), V1, ids=[f"{p.rsplit('/', 1)[-1]}:{f}" for p, _, f in V1])
def test_v1_refuses_a_lone_surrogate_naming_the_field(daemon: Daemon, sb: str, path: str,
                                                      body: dict[str, Any], field: str) -> None:
    before = daemon.guest_requests(sb)
    sandboxes = daemon.runtime.list_sandboxes()
    resp = post_json(daemon.client, path.format(sb=sb), body)
    assert resp.status_code == 400, resp.text
    assert f"field {field} contains the lone surrogate U+" in resp.json()["error"], resp.text
    # Refused before the guest saw it, and before a sandbox was spawned.
    assert daemon.guest_requests(sb) == before and daemon.runtime.list_sandboxes() == sandboxes


def test_v1_refuses_nul_in_c_strings_and_keeps_it_in_stdin(daemon: Daemon, sb: str) -> None:
    for body, field in (({"args": ["echo", "a\0b"]}, "args[1]"),
                        ({"args": ["true"], "env": {"A": "\0"}}, "env.A"),
                        ({"args": ["true"], "cwd": "/tmp\0"}, "cwd")):
        resp = post_json(daemon.client, f"/v1/sandboxes/{sb}/exec", body)
        assert resp.status_code == 400 and f"{field}: must not contain NUL" in resp.json()["error"], resp.text
    assert daemon.guest_requests(sb, "exec") == []
    # stdin is data: a NUL in it is a byte the process reads.
    resp = post_json(daemon.client, f"/v1/sandboxes/{sb}/exec", {"args": ["cat"], "stdin": "a\0b"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["stdout"] == "a\0b"
    assert [r["stdin"] for r in daemon.guest_requests(sb, "exec")] == ["a\0b"]


def start(client: TestClient, sb: str, process: dict[str, Any]) -> dict[str, Any]:
    """An E2B process Start (Connect, JSON); its one end frame's error."""
    payload = json.dumps({"process": process}).encode()
    resp = client.post("/process.Process/Start", content=struct.pack(">BI", 0, len(payload)) + payload,
                       headers={**envd(sb), "Content-Type": "application/connect+json"})
    assert resp.status_code == 200, resp.text
    flags, size = struct.unpack(">BI", resp.content[:5])
    assert flags & 2 and len(resp.content) == 5 + size, resp.content  # the end frame, and nothing else
    error: dict[str, Any] = json.loads(resp.content[5:])["error"]
    return error


@pytest.mark.parametrize(("process", "words"), [
    ({"cmd": "echo", "args": ["a\0b"]}, "field process.args[0] contains NUL"),
    ({"cmd": "ec\0ho"}, "field process.cmd contains NUL"),
    ({"cmd": "echo", "envs": {"A": "x\0"}}, "field process.envs['A'] contains NUL"),
    ({"cmd": "echo", "envs": {"A\0": "x"}}, "field process.envs['A\\x00'] (its name) contains NUL"),
    ({"cmd": "echo", "envs": {"A=B": "x"}}, "without '='"),
    ({"cmd": "echo", "cwd": "/tmp/\0"}, "field process.cwd contains NUL"),
    ({"cmd": f"/bin/{LONE}"}, "not a valid StartRequest"),  # the JSON codec: no UTF-8 form
    ({"cmd": "echo", "envs": {"A": "\udcff"}}, "not a valid StartRequest"),
    ({"cmd": "echo", "cwd": f"/tmp/{LONE}"}, "not a valid StartRequest"),
])
def test_e2b_start_refuses_what_the_guest_cannot_take(tmp_path: Path, process: dict[str, Any],
                                                      words: str) -> None:
    with daemon_app(tmp_path, snapshots=("base",)) as daemon:
        sb = daemon.sandbox("base").id
        before = daemon.guest_requests(sb)
        error = start(daemon.client, sb, process)
        assert error["code"] == "invalid_argument" and words in error["message"], error
        # Only the sandbox was looked up (the access check): the guest was asked nothing.
        assert daemon.guest_requests(sb) == before


def test_the_shared_check() -> None:
    assert bounds.text_problem("héllo ☃ \U0001f600") is None
    assert "U+DC80" in str(bounds.text_problem("ab\udc80"))
    assert bounds.text_problem("a\0", nul=False) is None
    assert "NUL at 1" in str(bounds.text_problem("a\0"))
    with pytest.raises(InvalidRequest, match=r"field env\.X contains the lone surrogate U\+D800 at 0"):
        bounds.check_guest_text("env.X", LONE)
