"""A stand-in for ``qemu-system-x86_64``: the real controller, VMM and process code over no VM.

``install(dir)`` writes an executable named ``qemu-system-x86_64`` into ``dir``; put ``dir`` first
on ``PATH`` and the daemon finds it where it looks for QEMU (``forkd.host.prereqs``). Everything
around the exec stays real: the listening sockets handed over by fd, the launcher prefix (a
cgroup, a network namespace), the pid file, kill and reaping, the disks (``qemu-img`` is real).

The process it starts (``python -m tests.fakes.vmm``, named ``qemu-system-x86_64`` so the
daemon's pid checks know it) serves, on the fds of its command line:

* QMP (``tests.fakes.qmp.FakeQMP``, QEMU's real wire protocol): ``stop``/``cont`` and their
  events, ``query-status``, migration out (``exec:`` URIs run through ``sh``, as QEMU does) and in
  (``fd:N``), with their MIGRATION events, ``blockdev-snapshot-sync`` (a real qcow2 overlay),
  ``query-named-block-nodes``, ``xen-save-devices-state`` and ``quit``;
* the guest agent (``tests.fakes.guest.ScriptedGuest``).

The "device state" it writes and reads back is the guest's state as JSON (behind QEMU's stream
header and configuration section, which the host reads), so a child restored from a snapshot
starts with what its template had.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import mmap
import os
import shlex
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

from forkd.guest import protocol
from tests.fakes.guest import REQUEST_LOG, GuestState, ScriptedGuest
from tests.fakes.qmp import FakeQMP, QMPError

_QEVM_HEADER = b"QEVM" + struct.pack(">I", 3)  # QEMU's stream magic and version
_SECTION_CONFIGURATION = 0x07
_MACHINE = b"microvm"


def _unframed(stream: bytes) -> bytes:
    """The JSON of a state ``_state`` framed (and the host may have spliced): past the header and
    the configuration sections."""
    if stream[:4] != b"QEVM":
        raise QMPError("the test double loads its own state streams only (no QEVM header)")
    stream = stream[8:]
    while stream[:1] == bytes([_SECTION_CONFIGURATION]):
        (length,) = struct.unpack(">I", stream[1:5])
        stream = stream[5 + length:]
    return stream

REPO = Path(__file__).resolve().parents[2]
SLOW_DISK = "slow-disk"  # in a VM's run dir: its live branches' RAM copies do not end (see migrate)
GUEST_WRITES_MIB = 2  # of its RAM a restored guest writes as it runs on
QEMU_FOOTPRINT_MIB = 96  # what a QEMU process uses of its own, beside the guest's RAM
VERSION = "QEMU emulator version 7.2.0 (forkd test double)"


def install(bin_dir: Path) -> Path:
    """Write the ``qemu-system-x86_64`` stand-in into ``bin_dir``; its path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "qemu-system-x86_64"
    pythonpath = os.pathsep.join([str(REPO), str(REPO / "src"), os.environ.get("PYTHONPATH", "")])
    # exec -a: the process's argv[0] (/proc/PID/cmdline) is "qemu-system-x86_64", as the daemon's
    # checks that a pid is still its QEMU expect; the run dir is in the arguments, as for QEMU.
    path.write_text("#!/bin/bash\n"
                    f"export PYTHONPATH={shlex.quote(pythonpath)}\n"
                    f'exec -a qemu-system-x86_64 {shlex.quote(sys.executable)} -m tests.fakes.vmm "$@"\n')
    path.chmod(0o755)
    return path


def _option(argv: list[str], flag: str, key: str) -> str | None:
    """``key=value`` from the first ``flag`` whose comma-separated options have ``key``."""
    for i, word in enumerate(argv[:-1]):
        if word != flag:
            continue
        for part in argv[i + 1].split(","):
            name, _, value = part.partition("=")
            if name == key:
                return value
    return None


def _chardev_fd(argv: list[str], chardev_id: str) -> int:
    for i, word in enumerate(argv[:-1]):
        if word == "-chardev" and f"id={chardev_id}," in argv[i + 1] + ",":
            opts = dict(p.partition("=")[::2] for p in argv[i + 1].split(",")[1:])
            return int(opts["fd"])
    raise SystemExit(f"no -chardev id={chardev_id}")


class FakeQemu:
    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.disk = Path(_option(argv, "-blockdev", "file.filename") or "")
        self.nodes: list[dict[str, Any]] = [
            {"node-name": "disk0", "drv": "qcow2", "file": str(self.disk)},
            {"node-name": "#block001", "drv": "file", "file": str(self.disk)}]
        self.incoming = "-incoming" in argv
        self.never_run = "-S" in argv
        self.status = "inmigrate" if self.incoming else "running"
        self.migration = "none"
        self.caps: dict[str, bool] = {}
        # QEMU runs in the VM's run dir; a guest that powers off ends it (-no-reboot).
        self.guest = ScriptedGuest(log=Path.cwd() / REQUEST_LOG, poweroff=lambda: os._exit(0))
        self.done = asyncio.Event()
        self.ram = self._map_ram(argv)
        console = _option(argv, "-chardev", "path")
        if console:
            with open(console, "a") as f:
                f.write("forkd test double: no guest kernel runs here\n")

    @staticmethod
    def _map_ram(argv: list[str]) -> mmap.mmap | None:
        """Map the guest RAM file as QEMU does (``share=on``: shared; off: private copy-on-write),
        so that what the daemon reads of a VM's memory mappings (/proc/PID/maps) is there."""
        path, share = _option(argv, "-object", "mem-path"), _option(argv, "-object", "share")
        if not path:
            return None
        with open(path, "r+b" if share == "on" else "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return None
            flags = mmap.MAP_SHARED if share == "on" else mmap.MAP_PRIVATE
            return mmap.mmap(f.fileno(), size, flags=flags,
                             prot=mmap.PROT_READ | mmap.PROT_WRITE)

    def _guest_writes_ram(self) -> None:
        """A guest that runs writes some of its RAM: in a child's private mapping, those pages
        become its own copies (what a branch's ``measure_diff`` counts)."""
        if self.ram is not None and _option(self.argv, "-object", "share") == "off":
            for offset in range(0, min(len(self.ram), GUEST_WRITES_MIB << 20), mmap.PAGESIZE):
                self.ram[offset] = 1

    # ------------------------------------------------------------ QMP

    async def _event(self, qmp: FakeQMP, name: str, data: dict[str, Any] | None = None) -> None:
        with contextlib.suppress(Exception):
            await qmp.emit(name, data)

    async def _set_status(self, qmp: FakeQMP, status: str) -> None:
        was = self.status
        self.status = status
        if was == "running" and status != "running":
            await self._event(qmp, "STOP")
        if was != "running" and status == "running":
            await self._event(qmp, "RESUME")

    async def _migration(self, qmp: FakeQMP, status: str) -> None:
        self.migration = status
        await self._event(qmp, "MIGRATION", {"status": status})

    def _state(self, *, configuration: bool = True) -> bytes:
        """The state in QEMU's stream framing (a header, then, in a migration stream but not in
        ``xen-save-devices-state``'s file, the configuration section naming the machine type), so the
        host's own reading of it (a hibernation's wake splices the two) is exercised; then JSON."""
        body = json.dumps({"guest": self.guest.state.to_json(), "running": self.status == "running"}).encode()
        config = bytes([_SECTION_CONFIGURATION]) + struct.pack(">I", len(_MACHINE)) + _MACHINE
        return _QEVM_HEADER + (config if configuration else b"") + body

    async def migrate(self, qmp: FakeQMP, args: dict[str, Any]) -> None:
        uri = str(args["uri"])
        if not uri.startswith("exec:"):
            raise QMPError(f"the test double migrates to exec: URIs only, not {uri!r}")
        state = self._state()
        await self._migration(qmp, "setup")
        background = self.caps.get("background-snapshot", False)
        if background:  # stops only to save the devices, then runs on
            await self._set_status(qmp, "paused")
        proc = await asyncio.create_subprocess_exec("/bin/sh", "-c", uri[len("exec:"):],
                                                    stdin=subprocess.PIPE)
        await proc.communicate(state)
        if proc.returncode != 0:
            await self._migration(qmp, "failed")
            return
        if background:
            await self._set_status(qmp, "running")
            await self._migration(qmp, "active")

            async def copied() -> None:
                # As QEMU, the command has answered; the RAM copy ends later. A disk too slow to
                # take it: while the VM's run dir has SLOW_DISK, the copy goes on (a live branch
                # stays "writing" as long as a test needs it to).
                while Path(SLOW_DISK).exists():
                    await asyncio.sleep(0.01)
                await self._migration(qmp, "completed")

            qmp.later(0, copied)
            return
        if self.caps.get("pause-before-switchover", False):
            await self._set_status(qmp, "paused")
            await self._migration(qmp, "pre-switchover")
            return
        await self._set_status(qmp, "postmigrate")
        await self._migration(qmp, "completed")

    async def migrate_continue(self, qmp: FakeQMP, _args: dict[str, Any]) -> None:
        await self._set_status(qmp, "postmigrate")
        await self._migration(qmp, "completed")

    async def migrate_incoming(self, qmp: FakeQMP, args: dict[str, Any]) -> None:
        uri = str(args["uri"])
        if not uri.startswith("fd:"):
            raise QMPError(f"the test double loads fd: URIs only, not {uri!r}")
        with os.fdopen(int(uri[3:]), "rb") as f:
            saved = json.loads(_unframed(f.read()))
        self.guest.state = GuestState.from_json(saved["guest"])
        self._guest_writes_ram()

        async def loaded() -> None:
            await self._migration(qmp, "completed")
            self.status = "paused"
            if saved["running"] and not self.never_run:
                await self._set_status(qmp, "running")

        qmp.later(0, loaded)

    async def cont(self, qmp: FakeQMP, _args: dict[str, Any]) -> None:
        await self._set_status(qmp, "running")

    async def stop(self, qmp: FakeQMP, _args: dict[str, Any]) -> None:
        await self._set_status(qmp, "paused")

    def query_status(self, _qmp: FakeQMP, _args: dict[str, Any]) -> dict[str, Any]:
        return {"status": self.status, "running": self.status == "running", "singlestep": False}

    def query_migrate(self, _qmp: FakeQMP, _args: dict[str, Any]) -> dict[str, Any]:
        return {"status": self.migration} if self.migration != "none" else {}

    def snapshot_sync(self, _qmp: FakeQMP, args: dict[str, Any]) -> None:
        new = str(args["snapshot-file"])
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(self.disk), new],
                       check=True, capture_output=True)
        self.disk = Path(new)
        name = str(args.get("snapshot-node-name") or f"#block{len(self.nodes):03d}")
        self.nodes += [{"node-name": name, "drv": "qcow2", "file": new},
                       {"node-name": f"#file-{name}", "drv": "file", "file": new}]

    def save_devices(self, _qmp: FakeQMP, args: dict[str, Any]) -> None:
        Path(args["filename"]).write_bytes(self._state(configuration=False))

    def quit(self, qmp: FakeQMP, _args: dict[str, Any]) -> None:
        qmp.later(0, self._quit)

    async def _quit(self) -> None:
        self.done.set()

    def handlers(self, qmp: FakeQMP) -> None:
        for name, handler in {
            "migrate": self.migrate, "migrate-continue": self.migrate_continue,
            "migrate-incoming": self.migrate_incoming, "cont": self.cont, "stop": self.stop,
            "query-status": self.query_status, "query-migrate": self.query_migrate,
            "blockdev-snapshot-sync": self.snapshot_sync, "xen-save-devices-state": self.save_devices,
            "query-named-block-nodes": lambda _q, _a: self.nodes, "quit": self.quit,
            "migrate-set-capabilities": self.set_caps,
        }.items():
            qmp.on(name, handler)

    def set_caps(self, _qmp: FakeQMP, args: dict[str, Any]) -> None:
        for cap in args.get("capabilities", []):
            self.caps[str(cap["capability"])] = bool(cap["state"])

    # ------------------------------------------------------------ run

    @staticmethod
    def _take_qemu_footprint() -> bytearray | None:
        """In a memory cgroup with a limit (a sandbox's ``memory_limit_mib``), use as much memory
        as a QEMU does before its guest runs, so that a limit too low for one ends as it would:
        the kernel's OOM killer ends this process. (Elsewhere, no need to spend the memory.)"""
        try:
            lines = Path("/proc/self/cgroup").read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            _, controllers, path = line.split(":", 2)
            rel = path.lstrip("/")
            if "memory" in controllers.split(","):  # cgroup v1
                candidates = [Path("/sys/fs/cgroup/memory") / rel / "memory.limit_in_bytes"]
            elif controllers == "":  # v2
                candidates = [Path("/sys/fs/cgroup") / rel / "memory.max"]
            else:
                continue
            for limit_file in candidates:
                with contextlib.suppress(OSError, ValueError):
                    if int(limit_file.read_text().strip()) < (1 << 40):
                        return bytearray(QEMU_FOOTPRINT_MIB << 20)  # zero-filled: every page touched
        return None

    async def run(self) -> None:
        self.footprint = self._take_qemu_footprint()
        qmp_sock = socket.socket(fileno=_chardev_fd(self.argv, "qmp"))
        agent_sock = socket.socket(fileno=_chardev_fd(self.argv, "agent"))
        qmp = FakeQMP(Path("qmp.sock"))
        self.handlers(qmp)
        await qmp.start(sock=qmp_sock)
        agent = await asyncio.start_unix_server(self.guest.serve, sock=agent_sock,
                                                limit=protocol.MAX_REQUEST_LINE)
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.done.set)
        await self.done.wait()
        agent.close()
        await qmp.stop()


def main(argv: list[str]) -> None:
    if "--version" in argv:
        print(VERSION)
        return
    asyncio.run(FakeQemu(argv).run())


if __name__ == "__main__":
    main(sys.argv[1:])
