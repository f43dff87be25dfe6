"""QEMU process lifecycle: start, track, kill, reap, and re-adopt after a restart.

The QMP and agent sockets are bound by us and handed to QEMU as listening file
descriptors (as libvirt does). The socket therefore exists before QEMU starts,
so connecting needs no polling, and it stays at its path for the VM's whole life,
so a restarted daemon can reconnect to a VM it did not start.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from forkd.errors import VMError
from forkd.host import prereqs
from forkd.vmm import console
from forkd.vmm.cmdline import LaunchSpec, build_argv

UNIX_PATH_MAX = 107


def listen_unix(path: Path) -> socket.socket:
    if len(str(path)) > UNIX_PATH_MAX:
        raise VMError(
            f"socket path {path} is longer than {UNIX_PATH_MAX} bytes; use a shorter data dir"
        )
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(4)
    return sock


@dataclass
class QemuProcess:
    """A running QEMU. ``proc`` is None for a process re-adopted after a daemon restart."""

    pid: int
    dir: Path
    proc: asyncio.subprocess.Process | None = None

    @property
    def qmp_path(self) -> Path:
        return self.dir / "qmp.sock"

    @property
    def agent_path(self) -> Path:
        return self.dir / "agent.sock"

    @property
    def console_log(self) -> Path:
        return self.dir / "console.log"

    @property
    def qemu_log(self) -> Path:
        return self.dir / "qemu.log"

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.returncode is None
        return pid_is_qemu(self.pid, self.dir)

    async def wait_exit(self) -> int | None:
        if self.proc is not None:
            return await self.proc.wait()
        while pid_is_qemu(self.pid, self.dir):
            await asyncio.sleep(0.05)
        return None

    def freeze(self) -> None:
        """SIGSTOP the QEMU process at once: its vCPUs and I/O threads stop where they are
        (a later ``kill`` still works); no QMP round trip, so nothing more gets written."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGSTOP)

    async def kill(self, grace: float = 0.0) -> None:
        """SIGTERM (if ``grace``), then SIGKILL; always reaps; never raises for a dead process."""
        if grace > 0 and self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wait_exit(), grace)
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.wait_exit(), 10)

    def tail(self, lines: int = 15) -> str:
        """The end of the guest console and of QEMU's own stderr, for error messages."""
        parts = []
        with contextlib.suppress(OSError):
            text = self.qemu_log.read_text(errors="replace").strip()
            if text:
                parts.append("--- qemu ---\n" + "\n".join(text.splitlines()[-lines:]))
        text = console.read_tail(self.console_log, lines)
        if text:
            parts.append("--- guest console ---\n" + text)
        return "\n".join(parts)


def pid_is_qemu(pid: int, run_dir: Path) -> bool:
    """True if ``pid`` is a live (not zombie) QEMU started for ``run_dir`` (guards pid reuse)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z" and b"qemu-system" in cmdline and str(run_dir).encode() in cmdline


@dataclass
class AgentSockets:
    """The listening QMP and agent sockets of one VM, bound before QEMU starts.

    Bound first so that the launch spec can name their fds directly, and so
    that connecting needs no polling: the socket exists before QEMU does.
    """

    qmp: socket.socket
    agent: socket.socket

    @classmethod
    def bind(cls, run_dir: Path) -> AgentSockets:
        run_dir.mkdir(parents=True, exist_ok=True)
        qmp = listen_unix(run_dir / "qmp.sock")
        try:
            agent = listen_unix(run_dir / "agent.sock")
        except BaseException:
            qmp.close()
            raise
        return cls(qmp, agent)

    @property
    def qmp_fd(self) -> int:
        return self.qmp.fileno()

    @property
    def agent_fd(self) -> int:
        return self.agent.fileno()

    def close(self) -> None:
        self.qmp.close()
        self.agent.close()


async def start_qemu(run_dir: Path, spec: LaunchSpec, sockets: AgentSockets,
                     launcher: Sequence[str] = (), inherit_fds: Sequence[int] = ()) -> QemuProcess:
    """Start QEMU for ``spec``, handing it ``sockets`` (closed here once QEMU has them).

    ``launcher`` is an argv prefix that must end by exec'ing the rest in the same
    process (joining a cgroup, entering a network namespace), so that the pid
    recorded here is QEMU's own. ``inherit_fds`` are handed to QEMU under the same
    numbers (e.g. the device state it reads with ``migrate-incoming fd:N``).
    """
    try:
        qemu = prereqs.require(prereqs.QEMU)["qemu-system-x86_64"]
        argv = build_argv(qemu, spec)
        (run_dir / "cmdline").write_text(" ".join([*launcher, *argv]) + "\n")
        with open(run_dir / "qemu.log", "wb") as log:
            proc = await asyncio.create_subprocess_exec(
                *launcher, *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(sockets.qmp_fd, sockets.agent_fd, *inherit_fds),
                # Own session: a Ctrl-C aimed at the daemon must not kill the VMs,
                # which a restarted daemon re-adopts.
                start_new_session=True,
                # Keep Python's SIG_IGN for SIGPIPE: QEMU writes migration streams
                # into pipes (exec:cat), and a reader that dies (disk full) must
                # fail the migration with EPIPE, not kill the VM with SIGPIPE.
                restore_signals=False,
                cwd=run_dir,
            )
    finally:
        # QEMU has its own copies of the listening fds now.
        sockets.close()
    (run_dir / "pid").write_text(f"{proc.pid}\n")
    return QemuProcess(pid=proc.pid, dir=run_dir, proc=proc)


def adopt(pid: int, run_dir: Path) -> QemuProcess | None:
    """A QEMU left running by a previous daemon, if it is still alive."""
    if pid and pid_is_qemu(pid, run_dir):
        return QemuProcess(pid=pid, dir=run_dir)
    return None


def qemus_under(root: Path) -> list[int]:
    """Live QEMUs whose command line names a path under ``root`` (a data dir): its VMs,
    its template boots and its branch helpers, whoever started them."""
    prefixes = {str(p).rstrip("/").encode() + b"/" for p in (root, root.resolve())}
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        is_qemu = b"qemu-system" in cmdline.split(b"\0", 1)[0]
        if state != "Z" and is_qemu and any(p in cmdline for p in prefixes):
            found.append(int(entry.name))
    return found


def kill_qemus_under(root: Path, keep: set[int]) -> list[int]:
    """SIGKILL every QEMU of data dir ``root`` but ``keep``; the pids killed."""
    killed = [pid for pid in qemus_under(root) if pid not in keep]
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return killed


def kill_pid_now(pid: int, run_dir: Path) -> None:
    """Synchronous best-effort SIGKILL, for reaping a dead daemon's leftovers."""
    if pid_is_qemu(pid, run_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while pid_is_qemu(pid, run_dir) and time.monotonic() < deadline:
            time.sleep(0.01)
