"""A helper process's output, read under a cap and a deadline.

debugfs on a guest's disk (host/extfs.py) and qemu-img on a sandbox's layers (vmm/disk_view.py)
read what a guest wrote, so what they print is bounded like any hostile input: output past the
cap, or a run past the deadline, is refused and the process killed. Either way it is reaped.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from forkd.errors import ForkdError

READ_CHUNK = 1 << 16


async def bounded_stdout(proc: asyncio.subprocess.Process, *, timeout: float, max_output: int,
                         refuse: Callable[[str], ForkdError], what: str) -> bytes:
    """``proc``'s stdout until it exits: at most ``max_output`` bytes, within ``timeout`` seconds;
    past either, ``refuse(message)`` is raised (``what`` names the tool in it) and ``proc`` killed."""
    assert proc.stdout is not None
    out = bytearray()
    try:
        async with asyncio.timeout(timeout):
            while chunk := await proc.stdout.read(READ_CHUNK):
                out += chunk
                if len(out) > max_output:
                    raise refuse(f"{what} wrote more than {max_output} bytes")
            await proc.wait()
    except TimeoutError:
        raise refuse(f"{what} ran past {timeout:.0f}s") from None
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    return bytes(out)


__all__ = ["bounded_stdout"]
