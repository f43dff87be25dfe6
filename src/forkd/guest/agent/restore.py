"""The ``restored`` action: make a freshly restored child its own machine.

Every child restored from one snapshot starts with the same kernel CRNG state,
the same ``random`` state and a clock stopped at snapshot time, so the host
sends fresh entropy and its clock with the first request after a restore.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import random
import struct
import sys
import time
from typing import Any

from forkd.guest.protocol import RequestError, check_env

# <linux/random.h>
RNDADDENTROPY = 0x40085203
RNDRESEEDCRNG = 0x5207
# fcntl.ioctl copies at most 1024 bytes of a bytes argument; RNDADDENTROPY takes
# an 8-byte header, so entropy is credited in chunks of this size.
ENTROPY_CHUNK = 512
MIN_ENTROPY_HEX = 32  # 16 bytes

RESTORES_KEY = "__forkd_restores__"  # in the eval namespace: [count of restores]


def reseed_after_restore(req: dict[str, Any], namespace: dict[str, Any]) -> dict[str, Any]:
    """Give this child its own randomness and the host's clock."""
    env = check_env(req.get("env"))  # refuse a bad map before touching the CRNG or the clock
    entropy_hex = req.get("entropy")
    if not isinstance(entropy_hex, str) or len(entropy_hex) < MIN_ENTROPY_HEX:
        raise RequestError("'entropy' must be at least 16 bytes of hex")
    try:
        entropy = bytes.fromhex(entropy_hex)
    except ValueError as exc:  # validate before touching the CRNG or the clock
        raise RequestError(f"'entropy' is not valid hex: {exc}") from None
    reseeded = False
    with open("/dev/urandom", "wb", buffering=0) as rnd:
        try:
            # fcntl.ioctl refuses a bytes argument over 1024 bytes: credit in chunks.
            for i in range(0, len(entropy), ENTROPY_CHUNK):
                chunk = entropy[i : i + ENTROPY_CHUNK]
                payload = struct.pack("ii", len(chunk) * 8, len(chunk)) + chunk
                fcntl.ioctl(rnd, RNDADDENTROPY, payload)
            fcntl.ioctl(rnd, RNDRESEEDCRNG)
            reseeded = True
        except OSError:
            rnd.write(entropy)  # not root? still mixes it in, without the credit
    seed = int.from_bytes(os.urandom(32), "little")
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        with contextlib.suppress(Exception):
            numpy.random.seed(seed % (2**32))
    clock_stepped = False
    time_ns = req.get("time_ns")
    if isinstance(time_ns, int) and time_ns > 0:
        try:
            time.clock_settime_ns(time.CLOCK_REALTIME, time_ns)
            clock_stepped = True
        except (OSError, AttributeError):
            clock_stepped = settime_fallback(time_ns)
    # Per-child inputs: eval'd code reads os.environ, and every exec inherits it.
    os.environ.update(env)
    # setdefault: eval'd code may have deleted the counter from its namespace.
    namespace.setdefault(RESTORES_KEY, [0])[0] += 1
    return {"reseeded": reseeded, "clock_stepped": clock_stepped, "time_ns": time.time_ns(),
            "env_set": len(env)}


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def settime_fallback(time_ns: int) -> bool:
    """clock_settime(CLOCK_REALTIME) through libc, where ``time`` lacks it."""
    libc = ctypes.CDLL(None, use_errno=True)
    ts = _Timespec(time_ns // 1_000_000_000, time_ns % 1_000_000_000)
    return bool(libc.clock_settime(0, ctypes.byref(ts)) == 0)
