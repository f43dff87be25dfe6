"""The ``restored`` action's logic, in-process with the kernel and clock calls stubbed out.

The agent's own tests never send a valid ``restored`` request (it would reseed
this host's CRNG and step its clock); the real reseed is checked in real VMs
(tests/integration/test_fork.py, test_pools.py, test_idle.py).
"""

from __future__ import annotations

import functools
import random
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from forkd.guest.agent import restore, trust
from forkd.guest.capabilities import AGENT_VERSION
from forkd.guest.protocol import RequestError


class FakeNumpy(types.ModuleType):
    """What restore touches of numpy: ``frombuffer`` and ``random.set_state``."""

    uint32 = "uint32"

    def __init__(self) -> None:
        super().__init__("numpy")
        self.states: list[tuple[Any, ...]] = []
        self.random = types.SimpleNamespace(set_state=self.states.append)

    @staticmethod
    def frombuffer(data: bytes, dtype: str) -> tuple[bytes, str]:
        return data, dtype


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    calls: dict[str, Any] = {"kernel": [], "clock": []}
    monkeypatch.setattr(restore, "reseed_kernel", lambda e: calls["kernel"].append(e) or True)
    monkeypatch.setattr(restore, "step_clock", lambda t: calls["clock"].append(t) or True)
    numpy = FakeNumpy()
    monkeypatch.setitem(sys.modules, "numpy", numpy)
    calls["numpy"] = numpy
    monkeypatch.setattr(restore.os, "environ", {})
    state = random.getstate()
    yield calls
    random.setstate(state)


def test_restore_reseeds_every_generator_and_steps_the_clock(stubbed: dict[str, Any]) -> None:
    entropy = bytes(range(64))
    ns: dict[str, Any] = {}
    before = random.getstate()
    out = restore.reseed_after_restore({"entropy": entropy.hex(), "time_ns": 1_700_000_000_000_000_000,
                                        "env": {"A": "1"}}, ns)
    assert stubbed["kernel"] == [entropy] and stubbed["clock"] == [1_700_000_000_000_000_000]
    assert random.getstate() != before
    [(name, (key, dtype), pos)] = stubbed["numpy"].states
    # A whole new MT19937 key (624 words), not a 32-bit seed.
    assert (name, len(key), dtype, pos) == ("MT19937", 624 * 4, "uint32", 624)
    assert out["reseeded"] and out["clock_stepped"] and out["env_set"] == 1
    assert list(out["steps_us"]) == list(restore.STEPS)
    assert all(isinstance(v, int) and v >= 0 for v in out["steps_us"].values())
    assert restore.os.environ["A"] == "1" and ns[restore.RESTORES_KEY] == [1]
    # The host refuses inputs an older agent would have ignored by this (RestoreInputs.too_new_for).
    assert out["agent_version"] == AGENT_VERSION


def test_two_restores_draw_different_numpy_keys(stubbed: dict[str, Any]) -> None:
    for _ in range(2):
        restore.reseed_after_restore({"entropy": "ab" * 32}, {})
    keys = [state[1][0] for state in stubbed["numpy"].states]
    assert keys[0] != keys[1]  # drawn from the kernel CRNG, not from the (equal) host entropy


def test_clock_only_steps_the_clock_and_nothing_else(stubbed: dict[str, Any]) -> None:
    before = random.getstate()
    ns: dict[str, Any] = {}
    out = restore.reseed_after_restore({"clock_only": True, "time_ns": 42}, ns)
    assert out["clock_stepped"] and stubbed["clock"] == [42]
    assert stubbed["kernel"] == [] and stubbed["numpy"].states == [] and random.getstate() == before
    assert ns == {}  # not counted as a restore


@pytest.mark.parametrize("time_ns", [None, 0, -5, "12", 1.5])
def test_clock_only_needs_a_positive_time(stubbed: dict[str, Any], time_ns: Any) -> None:
    with pytest.raises(RequestError, match="time_ns"):
        restore.reseed_after_restore({"clock_only": True, "time_ns": time_ns}, {})
    assert stubbed["clock"] == []


def test_bad_env_is_refused_before_anything_is_touched(stubbed: dict[str, Any]) -> None:
    with pytest.raises(RequestError):
        restore.reseed_after_restore({"entropy": "ab" * 32, "env": {"A": 1}}, {})
    assert stubbed["kernel"] == [] and stubbed["clock"] == []


def test_a_hostname_is_set_in_the_kernel_and_etc(stubbed: dict[str, Any], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    names: list[str] = []
    monkeypatch.setattr(restore.socket, "sethostname", names.append)
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "hosts").write_text("127.0.0.1\tlocalhost\n127.0.1.1\tsnapshot-box\n")
    monkeypatch.setattr(restore, "set_hostname", functools.partial(restore.set_hostname, etc=etc))
    for _ in range(2):  # the call is idempotent: a claim or a re-sent call gives the same files
        out = restore.reseed_after_restore({"entropy": "ab" * 32, "hostname": "worker-7.lab"}, {})
    assert names == ["worker-7.lab"] * 2 and "hostname" in out["steps_us"]
    assert (etc / "hostname").read_text() == "worker-7.lab\n"
    assert (etc / "hosts").read_text() == "127.0.0.1\tlocalhost\n127.0.1.1\tworker-7.lab\n"


@pytest.mark.parametrize("hostname", ["", "-a", "a-", "a..b", "a_b", "x" * 64, ".".join(["a" * 32] * 2), 7])
def test_a_bad_hostname_is_refused_before_anything_is_touched(
        stubbed: dict[str, Any], monkeypatch: pytest.MonkeyPatch, hostname: Any) -> None:
    names: list[str] = []
    monkeypatch.setattr(restore.socket, "sethostname", names.append)
    with pytest.raises(RequestError, match="hostname must be RFC 1123"):
        restore.reseed_after_restore({"entropy": "ab" * 32, "hostname": hostname}, {})
    assert stubbed["kernel"] == [] and stubbed["clock"] == [] and names == []


def _pem(tag: str) -> str:
    from forkd.host.egress_tls import SandboxCA
    return SandboxCA.make(tag).pem


def test_a_ca_to_trust_ends_each_bundle_in_place_of_the_last_one(
        stubbed: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fork's child: its parent's CA (a forkd block at the bundle's end) is replaced by its own;
    a bundle reached by two names (Alpine's cert.pem link) is written once; the environment of
    what exec and eval start points at it."""
    certs = tmp_path / "etc/ssl/certs"
    certs.mkdir(parents=True)
    bundle = certs / "ca-certificates.crt"
    bundle.write_text("-----BEGIN CERTIFICATE-----\nSYSTEM\n-----END CERTIFICATE-----\n")
    (tmp_path / "etc/ssl/cert.pem").symlink_to(bundle)
    own = certs / "forkd-egress-ca.pem"
    bundles = (bundle, tmp_path / "etc/pki/tls/certs/ca-bundle.crt", tmp_path / "etc/ssl/cert.pem")
    monkeypatch.setattr(restore, "trust_ca", functools.partial(trust.trust_ca, bundles=bundles, own=own))
    for env in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"):
        monkeypatch.setenv(env, "recorded")  # so that the test's changes to os.environ are undone
        monkeypatch.delenv(env)
    parent, child = _pem("parent"), _pem("child")
    restore.reseed_after_restore({"entropy": "ab" * 32, "trust": parent}, {})
    out = restore.reseed_after_restore({"entropy": "ab" * 32, "trust": child}, {})
    text = bundle.read_text()
    assert text.startswith("-----BEGIN CERTIFICATE-----\nSYSTEM\n")
    assert text.count(trust.TRUST_MARK) == 1 and text.endswith(child) and parent not in text
    assert own.read_text() == child and not (tmp_path / "etc/pki").exists()
    assert "trust" in out["steps_us"]
    import os
    assert os.environ["SSL_CERT_FILE"] == str(bundle) == os.environ["REQUESTS_CA_BUNDLE"]
    assert os.environ["NODE_EXTRA_CA_CERTS"] == str(own)


@pytest.mark.parametrize("trust", ["", "not a certificate", "-----BEGIN CERTIFICATE-----\n$(x)\n"
                                   "-----END CERTIFICATE-----\n", "x" * 9000, 7])
def test_a_bad_ca_to_trust_is_refused_before_anything_is_touched(
        stubbed: dict[str, Any], monkeypatch: pytest.MonkeyPatch, trust: Any) -> None:
    wrote: list[str] = []
    monkeypatch.setattr(restore, "trust_ca", wrote.append)
    with pytest.raises(RequestError, match="trust must be one PEM certificate"):
        restore.reseed_after_restore({"entropy": "ab" * 32, "trust": trust}, {})
    assert stubbed["kernel"] == [] and wrote == []
