"""api/connections.py: the log-repeat filter and the connection cap (the socket side is
tests/integration/test_hostile_client.py, against a real daemon)."""

from __future__ import annotations

import logging
import resource

import pytest

from forkd.api import connections
from forkd.api.connections import CONNECTION_SHARE, MIN_CONNECTIONS, LogRepeatFilter, connection_cap


def record(msg: str, name: str = "asyncio") -> logging.LogRecord:
    return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, None, None)


def test_a_repeated_line_is_written_once_per_window_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(connections.time, "monotonic", lambda: clock[0])
    flt = LogRepeatFilter(window=10)
    assert flt.filter(record("socket.accept() out of system resource"))
    assert not any(flt.filter(record("socket.accept() out of system resource")) for _ in range(1000))
    assert flt.filter(record("another message"))  # other lines are not held back
    clock[0] = 10.5
    late = record("socket.accept() out of system resource")
    assert flt.filter(late)
    assert "1000 more like this" in late.getMessage()


def test_the_cap_is_a_share_of_the_fd_limit() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert connection_cap() == max(MIN_CONNECTIONS, soft // CONNECTION_SHARE)


def test_one_record_gets_one_decision_on_every_handler() -> None:
    """The filter sits on several handlers; each must let the same record through."""
    flt = LogRepeatFilter(window=10)
    first = record("token file is readable by others")
    assert [flt.filter(first) for _ in range(3)] == [True, True, True]
    again = record("token file is readable by others")
    assert [flt.filter(again) for _ in range(3)] == [False, False, False]
