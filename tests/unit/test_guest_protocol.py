"""Unit tests of ``forkd.guest.protocol``: framing, the reply shape, limits and their relations."""

from __future__ import annotations

import base64
import math
from pathlib import Path

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
    # 9 + 9 file + 2 code + 1 watch + 9 proc + 3 vol
    assert len(set(protocol.ACTIONS)) == len(protocol.ACTIONS) == 33


def _worst_line(result: dict[str, object]) -> int:
    return len(protocol.encode(protocol.ok_reply(2**53, result)))


def test_every_reply_the_agent_sends_fits_the_host_line_limit() -> None:
    """The host drops longer lines: each reply the agent can send must fit, with room."""
    assert client.AgentClient(Path("/nonexistent")).max_line == protocol.MAX_REPLY_LINE
    # A file piece, base64.
    piece = base64.b64encode(b"\xff" * protocol.FILE_CHUNK).decode()
    assert _worst_line({"data": piece, "eof": True}) < protocol.MAX_REPLY_LINE
    # An output event, base64.
    out = base64.b64encode(b"\x00" * protocol.OUTPUT_CHUNK).decode()
    event = protocol.encode(protocol.event(2**53, {"type": "stdout", "data": out}))
    assert len(event) < protocol.MAX_REPLY_LINE // 16
    # An eval result of the most characters, each escaped to 6 bytes.
    text = "\x00" * protocol.EVAL_RESULT_MAX_CHARS
    assert _worst_line({"result": text, "error": None, "exit_code": 0}) < protocol.MAX_REPLY_LINE
    assert protocol.EXEC_OUTPUT_CAP <= protocol.EXEC_MAX_OUTPUT_CAP


def test_a_window_bounds_bytes_and_events() -> None:
    assert protocol.event_cost(0) == protocol.EVENT_COST_MIN
    assert protocol.event_cost(protocol.OUTPUT_CHUNK) == protocol.OUTPUT_CHUNK
    assert protocol.STREAM_WINDOW // protocol.EVENT_COST_MIN <= 1024  # events in flight per stream
    assert protocol.OUTPUT_CHUNK <= protocol.STREAM_WINDOW <= protocol.PROCESS_RING_BYTES


def test_notification_has_no_id() -> None:
    note = protocol.notification(protocol.PROC_ACK, {"stream": 3, "bytes": 10})
    assert note == {"action": "proc_ack", "stream": 3, "bytes": 10}
    with pytest.raises(ValueError):
        protocol.notification(protocol.PROC_ACK, {"id": 1})
    assert protocol.decode_reply(protocol.encode(protocol.event(7, {"type": "start", "pid": 1}))) == {
        "id": 7, "event": {"type": "start", "pid": 1}}


def test_constants_agree_with_the_host_side() -> None:
    assert protocol.PORT_NAME == cmdline.AGENT_PORT_NAME
    assert protocol.EVAL_DEFAULT_TIMEOUT_SECS == bounds.EVAL_TIMEOUT_SECS
