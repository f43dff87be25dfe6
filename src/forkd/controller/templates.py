"""Creating a snapshot: boot a template VM, warm it, run setup, save it.

The template's RAM *is* the snapshot's ``mem`` file (``share=on``), so saving
it writes only the device state; afterwards the template must never run again.
Everything is written into a staging directory that is renamed into place only
when complete, and registered only after that.

A template with a NIC (``nic``, or a ``tap`` name) boots in a network namespace
the daemon makes for it and removes afterwards (controller/network.py): no
host set-up. Its guest configures eth0 at boot from the kernel command line
(``forkd.net=``: the address every child keeps, the gateway, the host's DNS
servers), so every child starts with its network already up.
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from forkd import bounds
from forkd.config import DEFAULT_IMAGE, DEFAULT_MEM_MIB, DEFAULT_VCPUS, DEFAULT_WARM_IMPORTS, DataDir
from forkd.controller.host_accel import HostAccelerator
from forkd.controller.kernel_cells import warm_template
from forkd.controller.network import NetRequest, Networks
from forkd.controller.shared_volumes import SharedVolumes
from forkd.controller.snapshots import Forkable, SnapshotStore
from forkd.controller.tags import TagReservations
from forkd.controller.volumes import Volumes, mount_in_guest
from forkd.errors import Conflict, InvalidRequest, NotFound
from forkd.guest import protocol
from forkd.guest.client import AgentClient
from forkd.host import childnet, netplan
from forkd.host import netns as netns_mod
from forkd.host.egress import EgressPolicy
from forkd.host.netplan import ChildNet
from forkd.image.builder import Image, load_image
from forkd.image.kernel import is_elf
from forkd.store import layout
from forkd.store.layout import SnapshotDir
from forkd.store.records import SnapshotRecord, now_unix
from forkd.store.volume_spec import VolumeMount, is_shared
from forkd.vmm import probe
from forkd.vmm.cmdline import kernel_cmdline, new_config
from forkd.vmm.disk import create_overlay
from forkd.vmm.machine import VM

Progress = Callable[[str, float], None]
LINEAGE_MAX = 256  # snapshots between a branch and its template; the bound only guards a corrupt registry


@dataclass(frozen=True)
class ColdBoot:
    """How a sandbox boots afresh from its own disk: its template's kernel, initramfs and command
    line (warm imports, the guest's network)."""

    kernel: Path
    initrd: Path
    append: str


def no_progress(_step: str, _fraction: float) -> None:
    pass


def template_owner(tag: str) -> str:
    """Whose shared volumes a template's are while it is built (SharedVolumes' owner, not a sandbox id)."""
    return f"template {tag}"


@dataclass
class SnapshotSpec:
    """What POST /v1/snapshots asks for. Paths default to the built image."""

    tag: str
    image: str = DEFAULT_IMAGE
    kernel: str | None = None
    rootfs: str | None = None
    mem_mib: int = DEFAULT_MEM_MIB
    vcpus: int = DEFAULT_VCPUS
    boot_wait_secs: float = 120.0
    warm_imports: list[str] | None = None
    setup: list[list[str]] = field(default_factory=list)
    # Python run in the warm PID 1 interpreter before the snapshot (e.g. load a
    # dataset): every child then starts with it in memory, shared copy-on-write.
    setup_eval: list[str] = field(default_factory=list)
    setup_timeout_secs: float = 600.0
    # Accepted for the seeds' compatibility and ignored: the disk is always
    # attached read-write (a child's overlay must be writable, and template and
    # children must have the same device configuration).
    rw: bool = True
    # A virtio NIC for the template and so for every child: on ``tap`` (default forkd-tap0)
    # inside a namespace the daemon makes. Giving ``tap`` implies ``nic``.
    tap: str | None = None
    nic: bool = False
    # The template's own egress while it boots and runs ``setup`` (e.g. pip install).
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    # Volumes attached after the root disk, mounted before ``setup`` runs (controller/volumes.py).
    volumes: list[VolumeMount] = field(default_factory=list)

    @property
    def nic_tap(self) -> str | None:
        """The tap name of the template's NIC; None without one."""
        return self.tap or (netplan.DEFAULT_TAP if self.nic else None)

    def validate(self) -> list[str]:
        """Check every bound (callers of the Python API bypass the HTTP schema); the warm imports."""
        bounds.MEM_MIB.check(self.mem_mib)
        bounds.VCPUS.check(self.vcpus)
        bounds.BOOT_WAIT_SECS.check(self.boot_wait_secs)
        bounds.SETUP_TIMEOUT_SECS.check(self.setup_timeout_secs)
        if self.tap is not None:
            netns_mod.check_tap_name(self.tap)
        if self.nic_tap is None and not self.egress.is_default:
            raise InvalidRequest("allow_internet_access and network need a network device: "
                                 "add \"nic\": true")
        if self.egress.rules:
            # A template boots rather than being restored: its guest is never given a CA to trust.
            raise InvalidRequest("network.rules (header transforms) apply to sandboxes, not to a template's "
                                 "own network while it builds: give them at spawn or fork")
        warm = list(DEFAULT_WARM_IMPORTS if self.warm_imports is None else self.warm_imports)
        for mod in warm:
            if not isinstance(mod, str) or not bounds.MODULE_RE.match(mod):
                raise InvalidRequest(f"warm import {mod!r} is not a module name")
        for argv in self.setup:
            if not argv or not all(isinstance(a, str) for a in argv):
                raise InvalidRequest("each setup command must be a non-empty list of strings")
        return warm


class TemplateBuilder:
    def __init__(self, data: DataDir, store: SnapshotStore, tags: TagReservations,
                 accel: HostAccelerator, networks: Networks, volumes: Volumes,
                 shared: SharedVolumes | None = None) -> None:
        self._data = data
        self._volumes = volumes
        self._shared = shared  # serves a template's shared volumes while setup runs
        self._store = store
        self._tags = tags
        self._accel = accel
        self._networks = networks

    def _boot_files(self, spec: SnapshotSpec) -> tuple[Image, Path, Path, Path]:
        image = load_image(self._data, spec.image)
        kernel, rootfs = image.kernel, image.base  # this build's disk, under its own name
        if spec.kernel:
            kernel = Path(spec.kernel)
            if not is_elf(kernel):
                raise InvalidRequest(
                    f"kernel {spec.kernel} is not an ELF vmlinux (microvm boots the uncompressed "
                    "kernel; forkd image build extracts one from Debian's package)"
                )
        if spec.rootfs:
            rootfs = Path(spec.rootfs)
            if not rootfs.is_file():
                raise InvalidRequest(f"rootfs {spec.rootfs} does not exist")
            if rootfs.resolve() == image.rootfs.resolve():  # the seeds' name for the image's disk
                rootfs = image.base
        return image, kernel, image.initrd, rootfs

    def cold_boot(self, snap: Forkable) -> ColdBoot:
        """How a child of ``snap`` boots afresh on its own disk (a disk-only hibernation's wake):
        what its template booted. 409 if that is gone (the image deleted or rebuilt since)."""
        meta = snap.dir.read_meta()
        image_of = meta.get("image") or {}
        kernel: str | None = meta.get("kernel")
        parent = meta.get("parent_tag")
        for _ in range(LINEAGE_MAX):  # a branch names its image, not its kernel: its template does
            if kernel is not None or not parent:
                break
            parent_dir = self._store.dir(parent)
            parent_meta = parent_dir.read_meta() if parent_dir.meta_path.exists() else {}
            kernel, parent = parent_meta.get("kernel"), parent_meta.get("parent_tag")
        name = image_of.get("name") if isinstance(image_of, dict) else None
        if not isinstance(name, str):
            raise Conflict(f"snapshot {snap.record.tag!r} names no guest image to boot its children from")
        try:
            image = load_image(self._data, name)
        except NotFound as exc:
            raise Conflict(f"snapshot {snap.record.tag!r} was made from guest image {name!r}, which is "
                           f"gone: {exc}") from None
        if image_of.get("key") not in (None, image.key):
            raise Conflict(f"guest image {name!r} was rebuilt since snapshot {snap.record.tag!r} was "
                           "made: its kernel and initramfs are not the ones its disk was booted with")
        boot_kernel = Path(kernel) if kernel else image.kernel
        if not boot_kernel.is_file():
            raise Conflict(f"the kernel snapshot {snap.record.tag!r} was booted with ({boot_kernel}) is gone")
        warm = meta.get("warm_imports")
        warm = [m for m in warm if isinstance(m, str)] if isinstance(warm, list) else []
        extra = (netplan.guest_cmdline(snap.dns),) if snap.tap else ()
        return ColdBoot(boot_kernel, image.initrd,
                        kernel_cmdline(warm, accel=snap.config.accel, extra=extra))

    async def create(self, spec: SnapshotSpec, progress: Progress = no_progress) -> SnapshotRecord:
        """Boot a template, wait until its agent is warm, run setup, snapshot it."""
        warm = spec.validate()
        spec = dataclasses.replace(spec, volumes=self._volumes.resolve(spec.volumes))
        image, kernel, initrd, rootfs = self._boot_files(spec)
        tap = spec.nic_tap
        dns = childnet.host_resolvers() if tap else ()
        net = await self._networks.prepare(tap=tap, dns=dns, egress=spec.egress, per_child_netns=False,
                                           what="a snapshot with a NIC")
        with self._tags.reserved(spec.tag):
            return await self._create(spec, warm, image, kernel, initrd, rootfs, progress, net)

    async def _create(self, spec: SnapshotSpec, warm: list[str], image: Image, kernel: Path,
                      initrd: Path, rootfs: Path, progress: Progress,
                      net: NetRequest | None) -> SnapshotRecord:
        staging: SnapshotDir | None = None
        vm: VM | None = None
        network: ChildNet | None = None
        try:
            host = await self._accel.for_image(image)
            config = new_config(spec.mem_mib, spec.vcpus, host)
            staging = layout.staging_dir(self._data.snapshots, spec.tag)
            backing_fmt = "qcow2" if rootfs.suffix == ".qcow2" else "raw"
            create_overlay(rootfs.resolve(), staging.disk, backing_fmt)
            if spec.volumes:
                progress("preparing volumes", 0.03)
            drives, volumes = await self._volumes.attach_template(spec.volumes, staging)
            launcher: list[str] = []
            extra: tuple[str, ...] = ()
            if net is not None:
                progress("setting up the template's network", 0.04)
                network = await self._networks.acquire(self._networks.template_owner(), net)
                launcher = self._networks.launcher(network)
                extra = (netplan.guest_cmdline(net.dns),)
            progress("booting template", 0.05)
            vm, ping = await VM.boot(
                staging.path, config, mem_path=staging.mem, disk=staging.disk,
                kernel=kernel, initrd=initrd, append=kernel_cmdline(warm, accel=host, extra=extra),
                timeout=spec.boot_wait_secs, tap=net.tap if net else None, launcher=launcher,
                volumes=drives,
            )
            failed = dict(ping.get("warm_errors") or {})
            if spec.warm_imports is None:  # the default's numpy: imported where the image has it
                failed = {mod: why for mod, why in failed.items()
                          if not str(why).startswith("ModuleNotFoundError")}
            if failed:
                raise InvalidRequest(f"warm imports failed in the guest: {failed}")
            await mount_in_guest(vm, volumes)  # before setup: it may write them
            if any(is_shared(v) for v in volumes):
                if self._shared is None:
                    raise InvalidRequest("this daemon serves no shared volumes")
                template_vm = vm
                await self._shared.attach(template_owner(spec.tag), vm, volumes, vm_of=lambda: template_vm)
            await self._run_setup(vm, spec, progress)
            progress("warming the Jupyter kernel", 0.89)
            has_kernel = await warm_template(vm, spec.setup_timeout_secs)
            if volumes:
                # Its volumes' layers then hold what setup wrote (an export reads them), not only
                # its page cache in the snapshot's memory.
                await vm.call(lambda agent: agent.sync(spec.setup_timeout_secs))
            progress("snapshotting", 0.9)
            if self._shared is not None:  # ops queued from here on are its children's hosts' to answer
                self._shared.detach(template_owner(spec.tag))
            save_ms = await vm.save_template_state(staging.state)
            boot_s = vm.timings["boot_s"]
            await vm.shutdown()  # its RAM is now the snapshot: it must never run again
            vm = None
            created = now_unix()
            staging.write_meta({
                "tag": spec.tag,
                "created_at_unix": created,
                "config": config.to_json(),
                "image": {"name": image.name, "key": image.key,
                          "kernel_version": image.meta.get("kernel_version")},
                "kernel": str(kernel), "rootfs": str(rootfs),
                "warm_imports": warm,
                "setup": spec.setup,
                "setup_eval": spec.setup_eval,
                "jupyter_kernel": has_kernel,  # a live, warm IPython kernel every child inherits
                "numpy_version": ping.get("numpy_version"),
                "python_version": ping.get("python_version"),
                "qemu_version": probe.qemu_version(),
                "boot_secs": round(boot_s, 3),
                "save_state_ms": round(save_ms, 1),
                "parent_tag": None,
                "branched_from": None,
                # A NIC is part of the device config: children need a tap of this name.
                "tap": net.tap if net else None,
                # The resolvers baked into the guest (opened with allow_internet_access).
                "dns": list(net.dns) if net else [],
                # After the root disk, in device order: every child restores into the same list.
                "volumes": volumes,
            })
            final = layout.publish(staging, self._data.snapshots, spec.tag)
            staging = None
            record = SnapshotRecord(tag=spec.tag, dir=str(final.path), created_at_unix=created,
                                    volumes=volumes)
            self._store.register(record)
            progress("ready", 1.0)
            return record
        finally:
            if self._shared is not None:
                self._shared.detach(template_owner(spec.tag))
            if vm is not None:
                await vm.destroy()
            if network is not None:  # after its QEMU is gone
                await self._networks.release(network)
            if staging is not None:
                shutil.rmtree(staging.path, ignore_errors=True)

    @staticmethod
    async def _run_setup(vm: VM, spec: SnapshotSpec, progress: Progress) -> None:
        for i, argv in enumerate(spec.setup):
            progress(f"setup {i + 1}/{len(spec.setup)}: {' '.join(argv)[:60]}",
                     0.5 + 0.4 * i / max(1, len(spec.setup)))
            done = await vm.call(functools.partial(AgentClient.exec, req={
                "args": argv, "timeout_secs": spec.setup_timeout_secs}, timeout=spec.setup_timeout_secs + 30))
            if done["exit_code"] != 0:
                raise InvalidRequest(
                    f"setup command {argv} failed with exit code {done['exit_code']}: "
                    f"{(done.get('error') or done['stderr'] or done['stdout'])[-2000:]}"
                )
        for code in spec.setup_eval:
            progress(f"setup eval: {code[:60]}", 0.88)
            res = await vm.call(functools.partial(AgentClient.eval, req={
                "code": code, "timeout_secs": spec.setup_timeout_secs},
                timeout=spec.setup_timeout_secs + protocol.REPLY_GRACE_SECS))
            if res["exit_code"] != 0:
                raise InvalidRequest(f"setup_eval {code[:200]!r} failed: {res['error']}")
