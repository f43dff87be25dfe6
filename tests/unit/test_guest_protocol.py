"""Unit tests of ``forkd.guest.protocol``: framing, the reply shape, limits and their relations."""

from __future__ import annotations

import json
import math

import pytest

from forkd import bounds
from forkd.guest import client, protocol
from forkd.vmm import cmdline


def test_encode_is_one_compact_line() -> None:
    line = protocol.encode({"id": 1, "action": "eval", "code": "a\nb"})
    assert line == b'{"id":1,"action":"eval","code":"a\\nb"}\n'
    assert line.count(b"\n") == 1
    assert protocol.decode(line) == {"id": 1, "action": "eval", "code": "a\nb"}


def test_decode_raises_value_error_on_bad_lines() -> None:
    for line in (b"{not json", b"\xff\xfe", b""):
        with pytest.raises(ValueError):
            protocol.decode(line)


def test_request_envelope() -> None:
    assert protocol.request(3, protocol.EXEC, {"args": ["true"]}) == {
        "id": 3, "action": "exec", "args": ["true"]
    }
    for clash in ("id", "action"):
        with pytest.raises(ValueError, match="may not be named"):
            protocol.request(3, protocol.PING, {clash: 1})


def test_reply_shapes() -> None:
    assert protocol.ok_reply(4, {"pong": True}) == {"id": 4, "ok": True, "result": {"pong": True}}
    assert protocol.error_reply(None, "malformed request: x") == {
        "id": None, "ok": False, "error": "malformed request: x"
    }


@pytest.mark.parametrize(
    "line",
    [b"garbage", b"[1]", b'"text"', b'{"ok": true}', b'{"id": null, "ok": false}',
     b'{"id": true, "ok": true}', b'{"id": "7", "ok": true}', b'{"id": [7], "ok": true}',
     b'{"id": 1.5, "ok": true}'],
)
def test_decode_reply_ignores_what_is_not_a_reply(line: bytes) -> None:
    assert protocol.decode_reply(line) is None


def test_decode_reply() -> None:
    assert protocol.decode_reply(b'{"id": 7, "ok": true, "result": 1}\n') == {
        "id": 7, "ok": True, "result": 1
    }


def test_request_timeout() -> None:
    assert protocol.request_timeout({}, 30) == 30
    assert protocol.request_timeout({"timeout_secs": 0.5}, 30) == 0.5
    assert protocol.request_timeout({"timeout_secs": 1e300}, 30) <= 1e300
    bad_values: tuple[object, ...] = (0, -1, True, False, "5", None, [], math.nan, math.inf, -math.inf)
    for bad in bad_values:
        with pytest.raises(protocol.RequestError, match="'timeout_secs' must be a positive number"):
            protocol.request_timeout({"timeout_secs": bad}, 30)


def test_actions_are_distinct() -> None:
    assert len(set(protocol.ACTIONS)) == len(protocol.ACTIONS) == 17  # 7 + 9 file actions + context


def test_the_host_reads_any_reply_the_agent_can_send() -> None:
    assert client.READ_LIMIT == protocol.READ_LIMIT
    assert protocol.max_exec_reply_bytes(protocol.EXEC_MAX_OUTPUT_CAP) <= protocol.READ_LIMIT
    assert protocol.MAX_REQUEST_LINE <= protocol.READ_LIMIT
    assert protocol.EXEC_OUTPUT_CAP <= protocol.EXEC_MAX_OUTPUT_CAP


@pytest.mark.parametrize("worst", [b"\x00", b"\xff", b"\x1f", b'"', b"\\"])
def test_max_exec_reply_bytes_bounds_the_worst_output(worst: bytes) -> None:
    """Each output byte costs at most JSON_BYTES_PER_OUTPUT_BYTE on the wire, as the agent encodes it."""
    cap = 4096
    text = (worst * cap).decode("utf-8", "replace")  # what exec does with the bytes it kept
    result = {"stdout": text, "stderr": text, "exit_code": 0, "error": None, "timed_out": False,
              "duration_ms": 1e9, "stdout_bytes": 2**62, "stderr_bytes": 2**62,
              "stdout_truncated": True, "stderr_truncated": True, "signal": 9}
    line = protocol.encode(protocol.ok_reply(2**53, result))
    assert len(line) <= protocol.max_exec_reply_bytes(cap)
    assert json.loads(line)["result"]["stdout"] == text


def test_constants_agree_with_the_host_side() -> None:
    assert protocol.PORT_NAME == cmdline.AGENT_PORT_NAME
    assert protocol.EVAL_DEFAULT_TIMEOUT_SECS == bounds.EVAL_TIMEOUT_SECS
