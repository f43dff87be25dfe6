"""A helper process's output under a cap and a deadline (host/bounded_output.py), with real
processes: what a tool prints about a guest's disk is hostile input, and a tool that runs away
is killed and reaped, never waited on."""

from __future__ import annotations

import asyncio

import pytest

from forkd.errors import GuestError
from forkd.host.bounded_output import bounded_stdout

Ran = tuple[bytes, asyncio.subprocess.Process]


async def _run(*args: str, timeout: float = 10, max_output: int = 1 << 20) -> Ran:
    proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE)
    try:
        return await bounded_stdout(proc, timeout=timeout, max_output=max_output, refuse=GuestError,
                                    what=args[0]), proc
    finally:
        assert proc.returncode is not None  # reaped whatever happened


def test_the_whole_output_of_a_tool_that_ends() -> None:
    out, proc = asyncio.run(_run("printf", "a\\nb\\n"))
    assert out == b"a\nb\n" and proc.returncode == 0


def test_output_past_the_cap_is_refused_and_the_tool_killed() -> None:
    with pytest.raises(GuestError, match="yes wrote more than 4096 bytes"):
        asyncio.run(_run("yes", max_output=4096))  # it would print for ever


def test_a_tool_past_its_deadline_is_refused_and_killed() -> None:
    with pytest.raises(GuestError, match="sleep ran past 0s"):
        asyncio.run(_run("sleep", "30", timeout=0.3))
