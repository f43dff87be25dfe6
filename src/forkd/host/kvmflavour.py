"""Which KVM this host's ``/dev/kvm`` is: recognising PVM without booting a guest.

PVM (paging-based virtualisation) lets a VM that has no hardware
virtualisation offer a ``/dev/kvm`` (the ``kvm_pvm`` module), but only a guest
kernel built for PVM runs under it: a stock kernel hangs silently. The boot
probe (``vmm/probe.py``) found that out by waiting its whole KVM timeout, 20 s
on every fresh data dir; this finds it from the host's own facts first:

* ``/sys/module/kvm_pvm``: the module that serves ``/dev/kvm`` is PVM's;
* the KVM MSR ``0x4b564d11`` of a PVM guest reads ``"PVM"`` (through
  ``/dev/cpu/0/msr``, the ``msr`` module, root only): a PVM guest has no VMX or
  SVM, so any ``/dev/kvm`` it offers can only be PVM's.

Either one is enough. Neither readable (no ``msr`` module, not root) only means
"not known": the boot probe decides, as before.
"""

from __future__ import annotations

import os
from pathlib import Path

SYS_MODULE = Path("/sys/module")
PVM_MODULE = "kvm_pvm"
MSR_DEVICE = Path("/dev/cpu/0/msr")
PVM_MSR = 0x4B564D11  # in KVM's MSR range ("KVM" = 0x4b564d)
PVM_SIGNATURE = b"PVM"


def read_msr(index: int, device: Path = MSR_DEVICE) -> bytes | None:
    """The 8 bytes of MSR ``index`` (the msr driver reads it at that file offset); None when the
    device is missing or unreadable, or the CPU refuses the MSR (EIO: it does not exist)."""
    try:
        fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.pread(fd, 8, index)
    except OSError:
        return None
    finally:
        os.close(fd)


def pvm_reason(sys_module: Path = SYS_MODULE, msr_device: Path = MSR_DEVICE) -> str | None:
    """Why this host's ``/dev/kvm`` is PVM (a sentence for doctor and the probe cache); None if
    nothing says so."""
    if (sys_module / PVM_MODULE).is_dir():
        return (f"/dev/kvm is PVM (module {PVM_MODULE} is loaded), which runs only kernels built "
                "for PVM; a stock guest kernel hangs under it")
    value = read_msr(PVM_MSR, msr_device)
    if value is not None and value.rstrip(b"\0").startswith(PVM_SIGNATURE):
        return (f"this host is a PVM guest (MSR {PVM_MSR:#x} reads {PVM_SIGNATURE.decode()}): its "
                "/dev/kvm can only be PVM, which runs only kernels built for PVM")
    return None
