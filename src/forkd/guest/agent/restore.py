"""The ``restored`` action: make a freshly restored child its own machine.

Every child restored from one snapshot starts with the same kernel CRNG state,
the same ``random`` and numpy states and a clock stopped at snapshot time, so
the host sends fresh entropy and its clock with the first request after a
restore (and with every claim of a warm-pool member).

This is the first code a restored child runs, and under TCG a new QEMU process
translates every guest code path it runs for the first time; so each step here
takes the path that touches the least code (figures per step, measured in the
guest, are in docs/PERFORMANCE.md): the kernel's entropy goes through a
descriptor opened when the agent started (no path lookup after a restore), a
plain ``write`` plus one ``RNDRESEEDCRNG`` (no credit accounting: the CRNG is
long ready), and numpy's legacy global generator gets a whole new MT19937 state
from the freshly reseeded kernel (``set_state``: cheaper than ``seed`` with an
array, and all 19968 bits fresh rather than a 32-bit seed).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import random
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any

from forkd.guest.agent import RUNTIME_PREFIX
from forkd.guest.agent.trust import trust_ca
from forkd.guest.capabilities import AGENT_VERSION, CAP_PYTHON, CAPABILITIES, capabilities_since
from forkd.guest.messages import RestoredReply
from forkd.guest.protocol import RequestError, RestoreInputs

# <linux/random.h>
RNDADDENTROPY = 0x40085203
RNDRESEEDCRNG = 0x5207
# fcntl.ioctl copies at most 1024 bytes of a bytes argument; RNDADDENTROPY takes
# an 8-byte header, so entropy is credited in chunks of this size.
ENTROPY_CHUNK = 512
MIN_ENTROPY_HEX = 32  # 16 bytes
MT19937_WORDS = 624  # numpy's legacy RandomState key, uint32 words
PY_SEED_BYTES = 32

# What reseed_after_restore reports the time of, in order (``steps_us``).
STEPS = ("check", "kernel_crng", "python_random", "numpy_random", "clock", "env", "hostname", "trust")
# Debian's line for the machine's own name in /etc/hosts (so sudo and friends resolve it).
HOSTS_SELF = "127.0.1.1"

RESTORES_KEY = "__forkd_restores__"  # in the eval namespace: [count of restores]


def _open_urandom() -> int | None:
    try:
        return os.open("/dev/urandom", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return None


# Opened when the agent starts, that is before any snapshot is taken, so that a
# restored child does not walk the path (a few ms of first-time code under TCG).
_URANDOM_FD = _open_urandom()


def reseed_after_restore(req: dict[str, Any], namespace: dict[str, Any]) -> RestoredReply:
    """Give this child its own randomness and the host's clock.

    With ``clock_only`` (a child resumed after an idle pause: nothing was
    cloned, only time passed) the clock is stepped and nothing else is done.
    ``steps_us`` in the answer is what each step took, measured here.
    """
    if req.get("clock_only") is True:
        time_ns = req.get("time_ns")
        if not isinstance(time_ns, int) or time_ns <= 0:
            raise RequestError("'time_ns' must be a positive integer")
        return {"clock_stepped": step_clock(time_ns), "time_ns": time.time_ns()}
    marks = [time.perf_counter_ns()]
    inputs = RestoreInputs.from_wire(req)  # refuse bad inputs before touching the CRNG or the clock
    entropy_hex = req.get("entropy")
    if not isinstance(entropy_hex, str) or len(entropy_hex) < MIN_ENTROPY_HEX:
        raise RequestError("'entropy' must be at least 16 bytes of hex")
    try:
        entropy = bytes.fromhex(entropy_hex)
    except ValueError as exc:  # validate before touching the CRNG or the clock
        raise RequestError(f"'entropy' is not valid hex: {exc}") from None
    marks.append(time.perf_counter_ns())
    reseeded = reseed_kernel(entropy)
    marks.append(time.perf_counter_ns())
    # Both user-space generators draw from the kernel CRNG just reseeded.
    fresh = os.urandom(MT19937_WORDS * 4 + PY_SEED_BYTES)
    random.seed(int.from_bytes(fresh[-PY_SEED_BYTES:], "little"))
    marks.append(time.perf_counter_ns())
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        with contextlib.suppress(Exception):  # a numpy that eval'd code broke must not fail the restore
            key = numpy.frombuffer(fresh[: MT19937_WORDS * 4], dtype=numpy.uint32)
            numpy.random.set_state(("MT19937", key, MT19937_WORDS))
    marks.append(time.perf_counter_ns())
    clock_stepped = False
    time_ns = req.get("time_ns")
    if isinstance(time_ns, int) and time_ns > 0:
        clock_stepped = step_clock(time_ns)
    marks.append(time.perf_counter_ns())
    # Per-child inputs: eval'd code reads os.environ, and every exec inherits it.
    if inputs.env:
        os.environ.update(inputs.env)
    # setdefault: eval'd code may have deleted the counter from its namespace.
    namespace.setdefault(RESTORES_KEY, [0])[0] += 1
    marks.append(time.perf_counter_ns())
    if inputs.hostname is not None:
        set_hostname(inputs.hostname)
    marks.append(time.perf_counter_ns())
    if inputs.trust is not None:
        trust_ca(inputs.trust)
    marks.append(time.perf_counter_ns())
    steps = {name: (b - a) // 1000 for name, a, b in zip(STEPS, marks, marks[1:], strict=False)}
    # agent_version, capabilities: the host refuses inputs this agent would have ignored
    # (guest/capabilities.py: needed_by, Capabilities).
    return {"reseeded": reseeded, "clock_stepped": clock_stepped, "time_ns": time.time_ns(),
            "env_set": len(inputs.env), "steps_us": steps, "agent_version": AGENT_VERSION,
            "capabilities": capabilities()}


def capabilities() -> list[str]:
    """This agent's capabilities (ping's and restored's answers): its version's, but Python where
    it runs on forkd's runtime rather than on the image's own (guest_runtime.py)."""
    lacking = [CAP_PYTHON] if sys.prefix == RUNTIME_PREFIX else []
    return capabilities_since(int(AGENT_VERSION), lacking)


def require_python(action: str) -> None:
    """Refuse ``action`` where the agent runs on forkd's runtime: the image has no Python to run it in."""
    if CAP_PYTHON not in capabilities():
        raise RequestError(f"{action}: {CAPABILITIES[CAP_PYTHON].lacking}")


def set_hostname(name: str, etc: Path = Path("/etc")) -> None:
    """Make ``name`` (checked: RFC 1123) this guest's hostname: the kernel's (what ``hostname`` and
    ``uname -n`` say), /etc/hostname (for whatever reads the file) and /etc/hosts (so that the name
    resolves, as sudo wants). Idempotent, as the post-restore call must be."""
    try:
        socket.sethostname(name)
    except OSError as exc:
        raise RequestError(f"could not set the hostname: {exc}") from None
    with contextlib.suppress(OSError):  # the kernel's name is what counts; a read-only /etc is no failure
        (etc / "hostname").write_text(name + "\n")
        hosts = etc / "hosts"
        lines = hosts.read_text().splitlines() if hosts.exists() else []
        kept = [line for line in lines if line.split()[:1] != [HOSTS_SELF]]
        hosts.write_text("\n".join([*kept, f"{HOSTS_SELF}\t{name}"]) + "\n")


def reseed_kernel(entropy: bytes) -> bool:
    """Mix ``entropy`` into the kernel's input pool and reseed the CRNG from it.

    A ``write`` mixes without crediting; once the CRNG is ready (it is long
    before a snapshot) crediting changes nothing, and ``RNDRESEEDCRNG`` makes
    every later read come from a key derived from the pool as it is now. A CRNG
    that is not ready yet (ENODATA) gets the entropy credited first. Returns
    False where the reseed is refused (not root): the entropy is mixed in anyway.
    """
    fd = _URANDOM_FD if _URANDOM_FD is not None else _open_urandom()
    if fd is None:
        return False
    try:
        os.write(fd, entropy)
        try:
            fcntl.ioctl(fd, RNDRESEEDCRNG)
            return True
        except OSError:
            pass
        try:
            # fcntl.ioctl refuses a bytes argument over 1024 bytes: credit in chunks.
            for i in range(0, len(entropy), ENTROPY_CHUNK):
                chunk = entropy[i : i + ENTROPY_CHUNK]
                fcntl.ioctl(fd, RNDADDENTROPY, struct.pack("ii", len(chunk) * 8, len(chunk)) + chunk)
            fcntl.ioctl(fd, RNDRESEEDCRNG)
            return True
        except OSError:
            return False
    finally:
        if fd != _URANDOM_FD:
            os.close(fd)


def step_clock(time_ns: int) -> bool:
    """Set CLOCK_REALTIME to the host's ``time_ns`` (also used after an idle pause)."""
    try:
        time.clock_settime_ns(time.CLOCK_REALTIME, time_ns)
        return True
    except (OSError, AttributeError):
        return settime_fallback(time_ns)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def settime_fallback(time_ns: int) -> bool:
    """clock_settime(CLOCK_REALTIME) through libc, where ``time`` lacks it."""
    libc = ctypes.CDLL(None, use_errno=True)
    ts = _Timespec(time_ns // 1_000_000_000, time_ns % 1_000_000_000)
    return bool(libc.clock_settime(0, ctypes.byref(ts)) == 0)
