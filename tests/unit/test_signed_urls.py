"""Signed URLs nobody has a credential for: E2B's file URLs (api/e2b/signed.py) and template
upload URLs (api/e2b/templates.py), against the daemon's app on the real runtime (over the QEMU
double: the sandboxes a scan tries are real ones).

Issue 38, low 9: odd queries (``signature_expiration=--5``, ``²``, too many fields) were 500s
without any credential. Low 16: a signed file URL that names no sandbox cost one hash per
running sandbox, for anyone.
"""

from __future__ import annotations

import time
import types
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from forkd.api.e2b import signed
from forkd.api.e2b.signed import ScanBudgetSpent, SignerSearch
from forkd.api.e2b.tokens import AccessTokens
from tests.fakes.app import TOKEN, Daemon, daemon_app

SIG = "v1_" + "A" * 43  # the shape of a signature, made by no sandbox
HASH = "c" * 64
# Running sandboxes for the cost test: real ones, so a handful. What it proves does not depend on
# the number: a scan costs one hash per running sandbox, a named or known signer one in all, and
# scans share a budget (SignerSearch alone is tested with larger numbers below).
MANY = 6


async def _one_chunk(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _running(daemon: Daemon, n: int) -> list[str]:
    """``n`` sandboxes of ``py``, each with /home/user/s.txt ("signed"), in the order a scan tries them."""
    rt = daemon.runtime
    for record in daemon.run(rt.spawn, "py", n):
        daemon.run(rt.files.write, record.id, "/home/user/s.txt", _one_chunk(b"signed"), max_bytes=1 << 10)
    return [r.id for r in rt.list_sandboxes()]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the odd queries: each is refused before it reaches any sandbox's state."""
    with daemon_app(tmp_path_factory.mktemp("signed")) as d:
        _running(d, 1)
        yield d


@pytest.fixture
def client(daemon: Daemon) -> TestClient:
    return daemon.client


@pytest.fixture
def sandbox(daemon: Daemon) -> str:
    return daemon.runtime.list_sandboxes()[0].id


ODD_FILE_QUERIES = [
    f"path=a&signature={SIG}&signature_expiration=--5",
    f"path=a&signature={SIG}&signature_expiration=%C2%B2",  # superscript two
    f"path=a&signature={SIG}&signature_expiration=%EF%BC%91",  # fullwidth one
    f"path=a&signature={SIG}&signature_expiration=-",
    f"path=a&signature={SIG}&signature_expiration=1e3",
    f"path=a&signature={SIG}&signature_expiration=99999999999999999999",
    f"path=a&signature={SIG}&signature_expiration=1&signature_expiration=2",
    f"path=a&path=b&signature={SIG}",
    f"path=a&signature={SIG}&signature={SIG}",
    f"path=a&signature={SIG}&username=u&username=root",
    f"path=a&signature={SIG}&" + "&".join(["x=1"] * 20),
    f"path=%FF%FE&signature={SIG}&username=%00",
    "path=a&signature=v1_%C2%B2",
    "path=a&signature=" + "v1_" + "A" * 500,
]
ODD_UPLOAD_QUERIES = [
    "expires=--5&signature=x",
    "expires=%C2%B2&signature=x",
    "expires=%EF%BC%91&signature=x",
    "expires=99999999999&signature=x&signature=y",
    "expires=1&" + "&".join(["a=1"] * 6),
    "expires=99999999999&signature=%C2%B2",
    "expires=&signature=",
]


def _assert_refused_in_e2b_shape(resp: Any, query: str) -> None:
    assert resp.status_code in (400, 401, 403), (query, resp.status_code, resp.text)
    body = resp.json()
    assert set(body) == {"code", "message"} and body["code"] == resp.status_code, body


@pytest.mark.parametrize("query", ODD_FILE_QUERIES)
@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("named", [False, True], ids=["no-sandbox-id", "sandbox-id"])
def test_an_odd_signed_file_query_is_never_a_5xx(client: TestClient, sandbox: str, query: str,
                                                 method: str, named: bool) -> None:
    headers = {"E2b-Sandbox-Id": sandbox, "E2b-Sandbox-Port": "49983"} if named else {}
    _assert_refused_in_e2b_shape(client.request(method, "/files?" + query, headers=headers), query)


@pytest.mark.parametrize("query", ODD_UPLOAD_QUERIES)
def test_an_odd_template_upload_query_is_never_a_5xx(client: TestClient, query: str) -> None:
    resp = client.put(f"/templates/web/files/{HASH}?" + query, content=b"x")
    _assert_refused_in_e2b_shape(resp, query)


def _signed_query(path: str, sandbox: str) -> dict[str, str]:
    from e2b.sandbox.signature import get_signature

    made = get_signature(path, "read", "user", AccessTokens(TOKEN.encode()).envd(sandbox))  # type: ignore[arg-type]
    return {"path": path, "username": "user", "signature": made["signature"]}


@pytest.fixture
def trials(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each signature check, one hash over one sandbox's token, by sandbox id (a spy)."""
    seen: list[str] = []
    real = AccessTokens.file_signature

    def spy(self: AccessTokens, sandbox_id: str, *args: object, **kwargs: object) -> str:
        seen.append(sandbox_id)
        return real(self, sandbox_id, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(AccessTokens, "file_signature", spy)
    return seen


def test_a_signed_url_costs_one_hash_when_named_or_known_and_scans_share_a_budget(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trials: list[str]) -> None:
    # The scans' clock stands still: the budget does not refill during the test.
    monkeypatch.setattr(signed, "time", types.SimpleNamespace(monotonic=lambda: 1000.0, time=time.time))
    # Room for two scans of every sandbox, not three.
    monkeypatch.setattr(signed, "SCAN_TRIALS_PER_SEC", 2 * MANY + MANY // 2)
    with daemon_app(tmp_path) as daemon:
        client = daemon.client
        ids = _running(daemon, MANY)
        assert len(ids) == MANY
        first, last = ids[0], ids[-1]  # a scan for last's signature tries them all
        # Named by E2b-Sandbox-Id: one hash, whatever the signature.
        named = {"E2b-Sandbox-Id": first, "E2b-Sandbox-Port": "49983"}
        resp = client.get("/files", params={"path": "s.txt", "signature": SIG}, headers=named)
        assert resp.status_code == 401
        assert trials == [first]
        # Named by nothing, a real URL: found by a scan once, then by one hash.
        good = _signed_query("s.txt", last)
        trials.clear()
        assert client.get("/files", params=good).content == b"signed"
        assert len(trials) == MANY + 1  # every sandbox, then the envd app's own check
        trials.clear()
        assert client.get("/files", params=good).content == b"signed"
        assert len(trials) == 2  # the remembered signer, then the envd app's own check
        # A bad signature named by nothing scans within the budget, then is refused unhashed.
        trials.clear()
        resp = client.get("/files", params={"path": "s.txt", "signature": SIG})
        assert resp.status_code == 401 and "no running sandbox signed" in resp.json()["message"]
        assert len(trials) == MANY
        trials.clear()
        for _ in range(5):
            resp = client.get("/files", params={"path": "s.txt", "signature": SIG})
            assert resp.status_code == 429, resp.text
            assert resp.json()["code"] == 429 and "E2b-Sandbox-Id" in resp.json()["message"]
        assert trials == []
        # The known URL still costs one hash, budget or not.
        assert client.get("/files", params=good).content == b"signed"
        assert len(trials) == 2


def test_the_scan_budget_refills_with_time_and_fits_a_scan_larger_than_a_second() -> None:
    now = [0.0]
    search = SignerSearch(trials_per_sec=100, clock=lambda: now[0])
    ids = [f"sb-{i}" for i in range(150)]
    checked: list[str] = []

    def never(sandbox_id: str) -> bool:
        checked.append(sandbox_id)
        return False

    with pytest.raises(ScanBudgetSpent):  # 150 > the 100 a second allows so far
        search.find("v1_x", ids, never)
    assert checked == []
    now[0] = 0.5
    assert search.find("v1_x", ids, never) is None  # 150 accrued: the whole scan ran
    assert len(checked) == 150
    with pytest.raises(ScanBudgetSpent):
        search.find("v1_x", ids[:25], never)
    now[0] = 0.75  # 25 more accrued
    assert search.find("v1_x", ids[:25], never) is None
    now[0] = 100.0  # a long quiet spell refills to one scan's worth, no more
    search.find("v1_x", ids, never)
    with pytest.raises(ScanBudgetSpent):
        search.find("v1_x", ids[:1], never)
