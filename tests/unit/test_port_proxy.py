"""The port proxy's pure parts: which Host names a sandbox port, and the inbound half of a
sandbox's network policy (who may come in, and the Host the guest sees). The relaying itself
runs against real VMs in tests/integration/test_ways_in.py."""

from __future__ import annotations

import pytest

from forkd.api.port_proxy import target
from forkd.errors import InvalidRequest
from forkd.host.egress import EgressPolicy
from forkd.store.records import PoolKey


def host(value: str) -> dict[str, object]:
    return {"type": "http", "headers": [(b"accept", b"*/*"), (b"host", value.encode())]}


@pytest.mark.parametrize(("value", "wanted"), [
    ("8000-sb-1a2b3c-0000.forkd.localhost:8889", (8000, "sb-1a2b3c-0000")),
    ("1-x.example.com", (1, "x")),
    ("65535-sb-h1-abcdef-0001.sandboxes.example.com", (65535, "sb-h1-abcdef-0001")),
])
def test_a_host_of_port_dash_id_names_that_sandboxs_port(value: str, wanted: tuple[int, str]) -> None:
    assert target(host(value)) == wanted


@pytest.mark.parametrize("value", [
    "127.0.0.1:8889", "localhost:8889", "forkd.example.com", "8000-sb.", "0-sb.example.com",
    "65536-sb.example.com", "080-sb.example.com", "8000-.example.com", "8000-sb-1:80", "-8000-sb.x",
])
def test_the_daemons_own_hosts_are_not_port_traffic(value: str) -> None:
    assert target(host(value)) is None
    assert target({"type": "http", "headers": []}) is None


def test_the_inbound_policy_is_off_by_default_and_round_trips() -> None:
    default = EgressPolicy.from_request(None, None)
    assert not default.allow_public_traffic and default.mask_request_host is None
    policy = EgressPolicy.from_request(False, {"allow_public_traffic": True,
                                               "mask_request_host": "custom.example.com:${PORT}"})
    assert policy.request_host(8080) == "custom.example.com:8080"
    assert EgressPolicy.from_info(policy.info()) == policy
    # It opens no outbound traffic, so a sandbox without a NIC may carry it.
    assert policy.is_default and not policy.leaves_host([])
    # Pools match on the rules alone.
    assert PoolKey("t", egress=policy).outbound() == PoolKey("t")


@pytest.mark.parametrize("network", [
    {"allow_public_traffic": "yes"},
    {"mask_request_host": "evil\r\nX-Injected: 1"},
    {"mask_request_host": "a b"},
    {"mask_request_host": 7},
    {"mask_request_host": "x" * 300},
])
def test_a_bad_inbound_setting_is_a_clear_400(network: dict[str, object]) -> None:
    with pytest.raises(InvalidRequest, match="network\\."):
        EgressPolicy.from_request(None, network)
