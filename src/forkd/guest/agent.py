#!/usr/bin/python3
"""forkd in-guest agent.

Runs as PID 1 inside every forkd microVM (the initramfs ``switch_root``s into
it). It imports the configured "warm" modules once at boot, then serves
newline-delimited JSON requests over a virtio-serial port. Because the VM is
snapshotted after warm-up, every forked child starts with those modules already
imported in this very process: ``eval`` pays no import cost.

Stdlib only: this file is copied verbatim into the guest's root filesystem and
must run on whatever python3 the image has (3.9+).

Protocol (one JSON object per line, both directions)::

    -> {"id": 7, "action": "ping"}
    <- {"id": 7, "ok": true, "result": {"pong": true, "numpy_version": "1.24.2", "pid": 1}}
    <- {"id": 8, "ok": false, "error": "unknown action 'x'"}

Requests are handled concurrently, one thread each; responses carry the id of
the request they answer and may arrive in any order.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import fcntl
import importlib
import json
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback

AGENT_VERSION = "1"
DEFAULT_PORT_NAME = "org.forkd.agent"
DEFAULT_OUTPUT_CAP = 1 << 20  # bytes kept per stream of an exec
MAX_OUTPUT_CAP = 16 << 20
MAX_LINE = 64 << 20  # a request larger than this is refused, not buffered forever
# Once an exec's process has exited (or its group was killed), how long to keep
# reading its pipes: a background process it left behind (``server &``) may hold
# them open for ever, and must not hold up the answer.
OUTPUT_GRACE_SECS = 1.0
# fcntl.ioctl copies at most 1024 bytes of a bytes argument; RNDADDENTROPY takes
# an 8-byte header, so entropy is credited in chunks of this size.
ENTROPY_CHUNK = 512

# <linux/random.h>
RNDADDENTROPY = 0x40085203
RNDRESEEDCRNG = 0x5207


class RequestError(Exception):
    """A request that cannot be served; its message goes back to the host."""


# --------------------------------------------------------------------------- boot


def _cmdline_options() -> dict[str, str]:
    """``forkd.key=value`` words from the kernel command line."""
    opts: dict[str, str] = {}
    try:
        with open("/proc/cmdline") as f:
            words = f.read().split()
    except OSError:
        return opts
    for word in words:
        if word.startswith("forkd.") and "=" in word:
            key, value = word[len("forkd.") :].split("=", 1)
            opts[key] = value
    return opts


def _mount(source: str, target: str, fstype: str, options: str = "") -> None:
    os.makedirs(target, exist_ok=True)
    args = ["mount", "-t", fstype]
    if options:
        args += ["-o", options]
    with contextlib.suppress(OSError):
        subprocess.run([*args, source, target], stderr=subprocess.DEVNULL, check=False)


def _loopback_up() -> None:
    """``ip link set lo up`` without iproute2 (minbase images have none)."""
    import socket

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, siocgifflags, ifreq))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH14x", b"lo", flags | iff_up))


def setup_pid1_environment() -> None:
    """What an init would do: mounts, hostname, loopback. Only as PID 1."""
    os.environ.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    os.environ.setdefault("HOME", "/root")
    os.environ.setdefault("LANG", "C.UTF-8")
    mounted: set[str] = set()
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        mounted = {line.split()[1] for line in f}
    for src, target, fstype, options in (
        ("proc", "/proc", "proc", ""),
        ("sysfs", "/sys", "sysfs", ""),
        ("devtmpfs", "/dev", "devtmpfs", ""),
        ("devpts", "/dev/pts", "devpts", "gid=5,mode=620"),
        ("tmpfs", "/dev/shm", "tmpfs", "mode=1777"),
        ("tmpfs", "/run", "tmpfs", "mode=755"),
        ("tmpfs", "/tmp", "tmpfs", "mode=1777"),
    ):
        if target not in mounted:
            _mount(src, target, fstype, options)
    with contextlib.suppress(OSError):
        with open("/etc/hostname") as f:
            name = f.read().strip() or "forkd"
        with open("/proc/sys/kernel/hostname", "w") as f:
            f.write(name)
    _loopback_up()


def warm_up(modules: list[str], namespace: dict) -> dict[str, str]:
    """Import the warm modules into the eval namespace; return import errors."""
    errors: dict[str, str] = {}
    for name in modules:
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # a missing optional module must not kill PID 1
            errors[name] = f"{type(exc).__name__}: {exc}"
            continue
        namespace[name.split(".")[0]] = sys.modules[name.split(".")[0]]
        if name == "numpy":
            namespace["np"] = module
    return errors


# ---------------------------------------------------------------------- zombies


class Reaper:
    """Reaps orphans re-parented to PID 1 without stealing ``subprocess``'s children.

    ``os.waitpid(-1)`` would race with ``Popen.wait`` and lose exit codes, so the
    reaper only waits for zombie children it does not own: pids spawned by exec
    are registered under the same lock that guards the scan.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.owned: set[int] = set()
        self.wake = threading.Event()  # set from the SIGCHLD handler

    def reap_orphans(self) -> int:
        reaped = 0
        me = os.getpid()
        with self.lock:
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                pid = int(entry)
                if pid in self.owned:
                    continue
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        stat = f.read()
                except OSError:
                    continue
                fields = stat.rsplit(")", 1)[-1].split()
                if len(fields) > 1 and fields[0] == "Z" and int(fields[1]) == me:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, os.WNOHANG)
                        reaped += 1
        return reaped

    def run_forever(self, fallback_interval: float = 30.0) -> None:
        # Woken by SIGCHLD rather than polling: scanning /proc every second in
        # every one of N idle children costs real CPU under TCG.
        while True:
            self.wake.wait(fallback_interval)
            self.wake.clear()
            with contextlib.suppress(Exception):
                self.reap_orphans()


# ------------------------------------------------------------------------- exec


class _Capture:
    """What has been read from one pipe so far.

    Published as it is read (not only at EOF) so that the answer can be sent
    with the output seen so far while a background process still holds the pipe.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.kept = bytearray()
        self.total = 0

    def snapshot(self) -> tuple[bytes, int]:
        with self.lock:
            return bytes(self.kept), self.total


def _drain(stream, cap: int, out: _Capture) -> None:
    """Keep the first ``cap`` bytes of a pipe, count the rest, never block the child."""
    try:
        while True:
            try:
                chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
            except (OSError, ValueError):  # closed under us
                break
            if not chunk:
                break
            with out.lock:
                out.total += len(chunk)
                room = cap - len(out.kept)
                if room > 0:
                    out.kept += chunk[:room]
    finally:
        with contextlib.suppress(OSError):
            stream.close()


def _feed(stream, data: bytes) -> None:
    """Write stdin from its own thread: a child that never reads it must not
    block the agent before the timeout is even armed."""
    with contextlib.suppress(OSError, ValueError):  # BrokenPipeError is an OSError
        stream.write(data)
    with contextlib.suppress(OSError, ValueError):
        stream.close()


def run_exec(req: dict, reaper: Reaper) -> dict:
    args = req.get("args")
    if not isinstance(args, list) or not args or not all(isinstance(a, str) for a in args):
        raise RequestError("exec needs 'args': a non-empty list of strings")
    timeout = req.get("timeout_secs", 30)
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise RequestError("'timeout_secs' must be a positive number")
    cap = req.get("max_output_bytes", DEFAULT_OUTPUT_CAP)
    if not isinstance(cap, int) or not 0 <= cap <= MAX_OUTPUT_CAP:
        raise RequestError(f"'max_output_bytes' must be an integer in 0..{MAX_OUTPUT_CAP}")
    env = dict(os.environ)
    extra_env = req.get("env") or {}
    if not isinstance(extra_env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in extra_env.items()
    ):
        raise RequestError("'env' must map strings to strings")
    env.update(extra_env)
    cwd = req.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise RequestError("'cwd' must be a string")
    stdin_data = req.get("stdin")
    if stdin_data is not None and not isinstance(stdin_data, str):
        raise RequestError("'stdin' must be a string")

    started = time.monotonic()
    try:
        with reaper.lock:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=cwd,
                start_new_session=True,  # its own process group: a timeout kills all of it
            )
            reaper.owned.add(proc.pid)
    except FileNotFoundError as exc:
        missing = cwd if cwd and exc.filename == cwd else args[0]
        what = "working directory" if missing == cwd else "executable"
        message = f"{what} not found: {missing}"
        return _exec_result("", f"{message}\n", 127, message, started)
    except PermissionError as exc:
        message = f"permission denied: {exc.filename or args[0]}"
        return _exec_result("", f"{message}\n", 126, message, started)
    except OSError as exc:
        message = f"cannot start {args[0]}: {exc.strerror or exc}"
        return _exec_result("", f"{message}\n", 126, message, started)

    out = _Capture()
    err = _Capture()
    readers = [
        threading.Thread(target=_drain, args=(proc.stdout, cap, out), daemon=True),
        threading.Thread(target=_drain, args=(proc.stderr, cap, err), daemon=True),
    ]
    for t in readers:
        t.start()
    if stdin_data is not None:
        threading.Thread(
            target=_feed, args=(proc.stdin, stdin_data.encode()), daemon=True
        ).start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        with reaper.lock:
            reaper.owned.discard(proc.pid)
    # On a timeout the group was killed, so the pipes reach EOF at once. On a
    # normal exit a background process may still hold them (``daemon &``):
    # wait a bounded grace period in total (not per pipe), then answer with
    # what was read so far; the readers keep draining so it never blocks.
    deadline = time.monotonic() + OUTPUT_GRACE_SECS
    for t in readers:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    if timed_out:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    error = None
    exit_code = proc.returncode
    if timed_out:
        error = f"timed out after {timeout}s; process group killed"
        exit_code = 124
    out_data, out_total = out.snapshot()
    err_data, err_total = err.snapshot()
    result = _exec_result(
        out_data.decode("utf-8", "replace"),
        err_data.decode("utf-8", "replace"),
        exit_code,
        error,
        started,
    )
    result["timed_out"] = timed_out
    for name, total in (("stdout", out_total), ("stderr", err_total)):
        result[f"{name}_bytes"] = total
        result[f"{name}_truncated"] = total > cap
    if proc.returncode is not None and proc.returncode < 0:
        result["signal"] = -proc.returncode
    return result


def _exec_result(stdout: str, stderr: str, exit_code: int, error, started: float) -> dict:
    return {
        "stdout": stdout,
        "stderr": stderr,
        "exit_code": exit_code,
        "error": error,
        "timed_out": False,
        "duration_ms": round((time.monotonic() - started) * 1000, 3),
    }


# ------------------------------------------------------------------------- eval


class Evaluator:
    """Evaluates code in one namespace that persists across calls (PID 1's warm interpreter)."""

    def __init__(self, namespace: dict) -> None:
        self.namespace = namespace
        self.lock = threading.Lock()  # evals see each other's effects in order

    def evaluate(self, code: str) -> dict:
        if not isinstance(code, str):
            raise RequestError("eval needs 'code': a string")
        try:
            tree = ast.parse(code, mode="exec")
        except (SyntaxError, ValueError) as exc:  # ValueError: NUL bytes before 3.12
            return {"result": None, "error": f"{type(exc).__name__}: {exc}", "exit_code": 1}
        # Like the REPL: statements run, the value of a trailing expression is the result.
        tail = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            tail = ast.Expression(tree.body.pop().value)
        with self.lock:
            try:
                if tree.body:
                    exec(compile(tree, "<eval>", "exec"), self.namespace)
                value = eval(compile(tail, "<eval>", "eval"), self.namespace) if tail else None
                return {"result": repr(value), "error": None, "exit_code": 0}
            except BaseException as exc:
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    message = f"{type(exc).__name__}: {exc}"
                else:
                    message = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                return {"result": None, "error": message, "exit_code": 1}


# ---------------------------------------------------------------------- restore


def reseed_after_restore(req: dict, namespace: dict) -> dict:
    """Give this child its own randomness and the host's clock.

    Every child restored from one snapshot starts with the same kernel CRNG
    state, the same ``random`` state and a clock stopped at snapshot time.
    """
    entropy_hex = req.get("entropy")
    if not isinstance(entropy_hex, str) or len(entropy_hex) < 32:
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
            clock_stepped = _settime_fallback(time_ns)
    # setdefault: eval'd code may have deleted the counter from its namespace.
    namespace.setdefault("__forkd_restores__", [0])[0] += 1
    return {"reseeded": reseeded, "clock_stepped": clock_stepped, "time_ns": time.time_ns()}


def _settime_fallback(time_ns: int) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)

    class Timespec(ctypes.Structure):
        _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]

    ts = Timespec(time_ns // 1_000_000_000, time_ns % 1_000_000_000)
    return libc.clock_settime(0, ctypes.byref(ts)) == 0


# ----------------------------------------------------------------- fs freeze


class RootFreezer:
    """FIFREEZE/FITHAW of the root filesystem, for crash-free disk snapshots.

    A live branch freezes the filesystem (flushing it and holding new writes)
    so that the disk can be snapshotted while the vCPUs keep running.
    """

    FIFREEZE = 0xC0045877
    FITHAW = 0xC0045878

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.frozen = False

    def freeze(self) -> bool:
        with self.lock:
            if self.frozen:
                return True
            fd = os.open("/", os.O_RDONLY)
            try:
                fcntl.ioctl(fd, self.FIFREEZE, 0)
            except OSError as exc:
                raise RequestError(f"cannot freeze the root filesystem: {exc.strerror}") from None
            finally:
                os.close(fd)
            self.frozen = True
            return True

    def thaw(self) -> bool:
        with self.lock:
            if not self.frozen:
                return False
            fd = os.open("/", os.O_RDONLY)
            try:
                fcntl.ioctl(fd, self.FITHAW, 0)
            except OSError:
                pass  # already thawed (EINVAL): the goal is reached either way
            finally:
                os.close(fd)
            self.frozen = False
            return True


# ----------------------------------------------------------------------- server


class Agent:
    def __init__(self, warm: list[str]) -> None:
        self.namespace: dict = {"__name__": "__forkd__", "__forkd_restores__": [0]}
        self.warm_errors = warm_up(warm, self.namespace)
        self.warm = warm
        self.evaluator = Evaluator(self.namespace)
        self.reaper = Reaper()
        self.fs = RootFreezer()
        self.write_lock = threading.Lock()
        self.out_fd = -1

    def ping(self) -> dict:
        numpy = sys.modules.get("numpy")
        return {
            "pong": True,
            "numpy_version": getattr(numpy, "__version__", None),
            "pid": os.getpid(),
            "agent_version": AGENT_VERSION,
            "python_version": sys.version.split()[0],
            "warm": self.warm,
            "warm_errors": self.warm_errors,
            "restores": self.namespace.get("__forkd_restores__", [0])[0],
        }

    def handle(self, req: dict) -> dict:
        action = req.get("action")
        if action == "ping":
            return self.ping()
        if action == "exec":
            return run_exec(req, self.reaper)
        if action == "eval":
            return self.evaluator.evaluate(req.get("code"))
        if action == "restored":
            result = reseed_after_restore(req, self.namespace)
            # A live branch froze the filesystem while its state was captured;
            # children restored from that state must thaw their copy.
            result["thawed"] = self.fs.thaw()
            return result
        if action == "sync":
            os.sync()
            return {"synced": True}
        if action == "fsfreeze":
            return {"frozen": self.fs.freeze()}
        if action == "fsthaw":
            return {"thawed": self.fs.thaw()}
        raise RequestError(f"unknown action {action!r}")

    def respond(self, message: dict) -> None:
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        with self.write_lock:
            view = memoryview(data)
            while view:
                try:
                    n = os.write(self.out_fd, view)
                except InterruptedError:
                    continue
                except OSError:
                    time.sleep(0.01)  # host not connected: nothing else we can do
                    return
                view = view[n:]

    def serve_one(self, line: bytes) -> None:
        # Parsing is separate so that only a bad line is called malformed: a
        # ValueError raised while handling a valid request is an agent error.
        try:
            req = json.loads(line)  # bytes: invalid UTF-8 raises UnicodeDecodeError
        except ValueError as exc:
            self.respond({"id": None, "ok": False, "error": f"malformed request: {exc}"})
            return
        req_id = req.get("id") if isinstance(req, dict) else None
        try:
            if not isinstance(req, dict):
                raise RequestError("a request must be a JSON object")
            reply = {"id": req_id, "ok": True, "result": self.handle(req)}
        except RequestError as exc:
            reply = {"id": req_id, "ok": False, "error": str(exc)}
        except Exception as exc:  # the agent must outlive any bug in one request
            reply = {"id": req_id, "ok": False,
                     "error": f"agent error: {type(exc).__name__}: {exc}"}
        self.respond(reply)

    def serve(self, in_fd: int, out_fd: int, stop_at_eof: bool = False) -> None:
        """Read requests forever; an empty read means the host is not connected yet.

        With ``stop_at_eof`` (test mode over pipes) an empty read ends serving,
        after the requests already read have been answered.
        """
        self.out_fd = out_fd
        buf = bytearray()
        discarding = False  # inside an oversized line: drop bytes up to its newline
        in_flight: set[threading.Thread] = set()
        while True:
            try:
                chunk = os.read(in_fd, 1 << 16)
            except InterruptedError:
                continue
            except OSError:
                time.sleep(0.02)
                continue
            if not chunk:
                if stop_at_eof:
                    for t in list(in_flight):
                        t.join()
                    return
                time.sleep(0.005)
                continue
            buf += chunk
            while True:
                nl = buf.find(b"\n")
                if nl < 0:
                    if len(buf) > MAX_LINE and not discarding:
                        discarding = True
                        self.respond({"id": None, "ok": False, "error": "request too large"})
                    if discarding:
                        buf.clear()
                    break
                line = bytes(buf[:nl])
                del buf[: nl + 1]
                if discarding:  # the tail of the oversized line, not a request
                    discarding = False
                    continue
                if line.strip():
                    in_flight = {t for t in in_flight if t.is_alive()}
                    t = threading.Thread(target=self.serve_one, args=(line,), daemon=True)
                    in_flight.add(t)
                    t.start()


def find_port(name: str) -> str | None:
    """The /dev/vportNpM whose virtio-serial name is ``name``."""
    base = "/sys/class/virtio-ports"
    with contextlib.suppress(OSError):
        for port in os.listdir(base):
            with contextlib.suppress(OSError), open(f"{base}/{port}/name") as f:
                if f.read().strip() == name:
                    return f"/dev/{port}"
    return None


def main() -> None:
    opts = _cmdline_options()
    is_pid1 = os.getpid() == 1
    if is_pid1:
        setup_pid1_environment()
        os.chdir("/root" if os.path.isdir("/root") else "/")
    warm = [m for m in opts.get("warm", "numpy").split(",") if m]
    agent = Agent(warm)
    if is_pid1:
        signal.signal(signal.SIGCHLD, lambda _sig, _frame: agent.reaper.wake.set())
        threading.Thread(target=agent.reaper.run_forever, daemon=True).start()
    if "--stdio" in sys.argv:  # host-side tests drive the agent over pipes
        # The protocol gets private copies of fds 0/1; the standard fds then point
        # at /dev/null and stderr, so a print() or input() in eval'd code cannot
        # corrupt the reply stream or swallow request bytes.
        proto_in, proto_out = os.dup(0), os.dup(1)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.dup2(2, 1)
        agent.serve(proto_in, proto_out, stop_at_eof=True)
        return
    port_name = opts.get("port", DEFAULT_PORT_NAME)
    path = None
    for _ in range(500):
        path = find_port(port_name)
        if path:
            break
        time.sleep(0.02)
    if not path:
        print(f"forkd-agent: virtio-serial port {port_name!r} not found", file=sys.stderr)
        if is_pid1:
            while True:
                time.sleep(3600)
        sys.exit(1)
    fd = os.open(path, os.O_RDWR)
    print(f"forkd-agent: ready on {path} (warm: {','.join(warm)})", file=sys.stderr, flush=True)
    agent.serve(fd, fd)


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        traceback.print_exc()
        if os.getpid() == 1:  # PID 1 must never exit: the kernel would panic
            while True:
                time.sleep(3600)
        raise
