"""Pick the accelerator by really booting a guest, not by opening /dev/kvm.

A VMM job (it boots QEMU), hence here; what it boots (``ProbeGuest``) and what it
picks (``Accel``) are plain host records in :mod:`forkd.host.accel`.

On our CI hosts /dev/kvm exists but is PVM (paging-based nested virt), under
which a stock kernel hangs silently. So the probe boots the image's kernel and
initramfs in probe mode (``forkd.probe=1``: init prints a marker and powers off)
under KVM; if the marker does not appear in time, TCG it is. A host whose
/dev/kvm is recognisably PVM (``host/kvmflavour.py``: its kvm_pvm module or
its PVM MSR) skips the KVM boot and its 20 s wait. The answer is
cached per (QEMU version, host kernel, guest kernel), and ``FORKD_ACCEL``
(kvm | tcg | auto) overrides it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from forkd.config import DataDir
from forkd.errors import VMError
from forkd.host import kvmflavour, prereqs
from forkd.host.accel import Accel, ProbeGuest
from forkd.vmm.cmdline import MACHINE, kernel_cmdline

PROBE_MARKER = b"FORKD-PROBE-OK"
KVM_PROBE_TIMEOUT = 20.0
TCG_PROBE_TIMEOUT = 60.0


@functools.cache
def qemu_version() -> str:
    qemu = prereqs.require(prereqs.QEMU)["qemu-system-x86_64"]
    out = subprocess.run([qemu, "--version"], capture_output=True, text=True).stdout
    return out.splitlines()[0].strip() if out else "unknown"


def _probe_key(guest: ProbeGuest) -> dict[str, str]:
    return {"qemu": qemu_version(), "host_kernel": platform.release(),
            "guest_kernel": guest.kernel_version}


def cached_probe(data: DataDir) -> dict[str, Any] | None:
    try:
        cached: dict[str, Any] = json.loads(data.host_probe.read_text())
        return cached
    except (OSError, ValueError):
        return None


async def boot_probe(guest: ProbeGuest, accel: Accel, timeout: float, tmp: Path) -> tuple[bool, str]:
    """Boot kernel + initramfs only; True if init ran and printed the marker. Its console goes
    under ``tmp`` (the data dir's scratch, collected at start if this process dies)."""
    qemu = prereqs.require(prereqs.QEMU)["qemu-system-x86_64"]
    tmp.mkdir(mode=0o700, parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="probe-", dir=tmp))
    console = workdir / "console.log"
    argv = [
        qemu, "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
        "-machine", MACHINE.replace(",memory-backend=mem", ""), *accel.args(), "-m", "256M",
        "-kernel", str(guest.kernel), "-initrd", str(guest.initrd),
        "-append", kernel_cmdline([], accel=accel, probe=True), "-serial", f"file:{console}",
    ]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if console.exists() and PROBE_MARKER in console.read_bytes():
                return True, ""
            if proc.returncode is not None:
                break
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), 0.1)
        if console.exists() and PROBE_MARKER in console.read_bytes():
            return True, ""
        out = b""
        if proc.returncode is not None and proc.stdout is not None:
            out = await proc.stdout.read()
        why = out.decode(errors="replace").strip()[-300:] or f"no boot within {timeout:.0f}s"
        if console.exists():
            why += "; console: " + console.read_bytes().decode(errors="replace").strip()[-400:]
        return False, why
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        await proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


async def probe(data: DataDir, guest: ProbeGuest, *, force: bool = False) -> dict[str, Any]:
    """The accelerator this host really boots guests with (cached)."""
    key = _probe_key(guest)
    cached = cached_probe(data)
    if cached and not force and cached.get("key") == key:
        return cached
    result: dict[str, Any] = {"key": key, "probed_at_unix": int(time.time())}
    kvm_ok, kvm_error = False, "/dev/kvm is missing"
    if os.path.exists("/dev/kvm"):
        if pvm := kvmflavour.pvm_reason():
            kvm_error = f"{pvm} (recognised without a boot)"
        elif os.access("/dev/kvm", os.R_OK | os.W_OK):
            kvm_ok, kvm_error = await boot_probe(guest, Accel.kvm(), KVM_PROBE_TIMEOUT, data.tmp)
        else:
            kvm_error = "/dev/kvm is not accessible to this user"
    if kvm_ok:
        accel = Accel.kvm()
    else:
        tcg_ok, tcg_error = await boot_probe(guest, Accel.tcg(), TCG_PROBE_TIMEOUT, data.tmp)
        if not tcg_ok:
            raise VMError(f"the guest kernel boots under neither KVM ({kvm_error}) nor TCG ({tcg_error})")
        accel = Accel.tcg()
    result.update({"accel": accel.name, "cpu": accel.cpu, "kvm_error": None if kvm_ok else kvm_error})
    data.root.mkdir(parents=True, exist_ok=True)
    tmp = data.host_probe.with_suffix(".tmp")
    # Private whatever the umask, like everything forkd keeps (docs/SECURITY.md).
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(json.dumps(result, indent=2))
    os.chmod(tmp, 0o600)  # an older file of that name keeps its mode through O_TRUNC
    os.replace(tmp, data.host_probe)
    return result


async def select_accel(data: DataDir, guest: ProbeGuest) -> Accel:
    forced = os.environ.get("FORKD_ACCEL", "auto").lower()
    if forced == "tcg":
        return Accel.tcg()
    if forced == "kvm":
        return Accel.kvm()
    if forced != "auto":
        raise VMError(f"FORKD_ACCEL must be kvm, tcg or auto, not {forced!r}")
    result = await probe(data, guest)
    return Accel(result["accel"], result["cpu"])
