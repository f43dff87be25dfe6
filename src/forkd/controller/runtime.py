"""The forkd runtime: the one Python API the daemon, benchmarks and tests use.

It owns the registry, every VM it started, and the rules: tags and ids are
validated before any path is built from them, nothing half-made is ever
registered, and no QEMU process outlives a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forkd import bounds
from forkd.config import DEFAULT_IMAGE, DEFAULT_MEM_MIB, DEFAULT_VCPUS, DEFAULT_WARM_IMPORTS, DataDir
from forkd.controller.branch import Brancher
from forkd.errors import Conflict, ForkdError, GuestError, InvalidRequest, NotFound, VMError
from forkd.host import cgroups
from forkd.host import netns as netns_mod
from forkd.host import probe as accel_mod
from forkd.host.accel import Accel, check_compatible
from forkd.host.shm import ShmMemory
from forkd.image.builder import Image, load_image
from forkd.image.kernel import is_elf
from forkd.store import layout
from forkd.store.layout import SnapshotDir, check_sandbox_id, check_tag
from forkd.store.registry import Registry, SandboxRecord, SnapshotRecord, now_unix
from forkd.vmm.cmdline import VMConfig, kernel_cmdline
from forkd.vmm.disk import clone_overlay, create_overlay
from forkd.vmm.machine import VM
from forkd.vmm.process import adopt, kill_pid_now, pid_is_qemu

log = logging.getLogger("forkd.runtime")

Progress = Callable[[str, float], None]

# Restoring is CPU-bound under TCG; more in flight than this only thrashes 2 cores.
SPAWN_PARALLELISM = 8


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
    rw: bool = True
    tap: str | None = None


def _no_progress(_step: str, _fraction: float) -> None:
    pass


class Runtime:
    def __init__(self, data: DataDir, registry: Registry) -> None:
        self.data = data
        self.registry = registry
        self.vms: dict[str, VM] = {}
        self._accel: Accel | None = None
        self._tags_in_flight: set[str] = set()
        # Claimed by spawns/templates in flight (not yet, or never, in the registry).
        self._netns_reserved: set[int] = set()
        self._host_taps_busy: set[str] = set()
        self._closed = False
        self.brancher = Brancher(self)
        self.shm = ShmMemory(data.root)

    # ---------------------------------------------------------------- open/close

    @classmethod
    async def open(cls, data: DataDir | None = None) -> Runtime:
        data = (data or DataDir.from_env()).ensure()
        rt = cls(data, Registry(data.registry))
        await rt._recover()
        return rt

    async def _recover(self) -> None:
        """Re-adopt sandboxes whose QEMU survived a daemon restart; reap the rest."""
        for name in layout.remove_stale_staging(self.data.snapshots):
            log.warning("removed interrupted snapshot write %s", name)
        for snap in self.registry.list_snapshots():
            if snap.status == "writing" or not SnapshotDir(Path(snap.dir)).complete():
                log.warning("snapshot %s was not complete at restart; removing it", snap.tag)
                shutil.rmtree(snap.dir, ignore_errors=True)
                self.registry.delete_snapshot(snap.tag)
        for sb in self.registry.list_sandboxes():
            run_dir = Path(sb.dir)
            process = adopt(sb.pid or 0, run_dir)
            if process is not None:
                try:
                    config = VMConfig.from_json(sb.meta["config"])
                    self.vms[sb.id] = await VM.attach(process, config)
                    log.info("re-adopted sandbox %s (pid %s)", sb.id, sb.pid)
                    continue
                except (ForkdError, KeyError, OSError) as exc:
                    log.warning("cannot re-adopt %s (%s); killing it", sb.id, exc)
            kill_pid_now(sb.pid or 0, run_dir)
            await self._remove_cgroup(sb.meta.get("cgroup"))
            shutil.rmtree(run_dir, ignore_errors=True)
            self.registry.delete_sandbox(sb.id)
            log.info("reaped dead sandbox %s", sb.id)
        # Run dirs no row points at (a crash between mkdir and insert).
        known = {sb.id for sb in self.registry.list_sandboxes()}
        for d in self.data.sandboxes.iterdir():
            if d.is_dir() and d.name not in known:
                with contextlib.suppress(OSError, ValueError):
                    kill_pid_now(int((d / "pid").read_text()), d)
                with contextlib.suppress(OSError):
                    await self._remove_cgroup((d / "cgroup").read_text().strip())
                shutil.rmtree(d, ignore_errors=True)
        self.shm.prune(keep={sb.snapshot_tag for sb in self.registry.list_sandboxes() if sb.live_fork})

    async def close(self, *, keep_sandboxes: bool = False) -> None:
        """Stop every sandbox (or, with ``keep_sandboxes``, leave them for the next daemon)."""
        if self._closed:
            return
        self._closed = True
        await self.brancher.wait_background()
        if keep_sandboxes:
            for vm in self.vms.values():
                await vm.agent.close()
                await vm.qmp.close()
            self.vms.clear()
        else:
            await asyncio.gather(*(self.kill(i) for i in list(self.vms)), return_exceptions=True)
            if not any(sb.meta.get("cgroup") for sb in self.registry.list_sandboxes()):
                cgroups.remove_parent_if_empty()
            # No sandbox left to need them: give the RAM back.
            self.shm.prune(keep=set())
        self.registry.close()

    async def __aenter__(self) -> Runtime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---------------------------------------------------------------- accelerator

    async def host_accel(self, image: Image) -> Accel:
        if self._accel is None:
            self._accel = await accel_mod.select_accel(self.data, image.probe_guest())
        return self._accel

    async def _host_accel_for(self, sdir: SnapshotDir) -> Accel:
        """The host's accelerator, probed with the snapshot's image if not known yet."""
        if self._accel is None:
            try:
                image = load_image(self.data, sdir.read_meta()["image"]["name"])
            except NotFound:
                cached = accel_mod.cached_probe(self.data)
                if not cached:
                    raise
                self._accel = Accel(cached["accel"], cached["cpu"])
            else:
                await self.host_accel(image)
        assert self._accel is not None
        return self._accel

    # ---------------------------------------------------------------- snapshots

    def list_snapshots(self) -> list[SnapshotRecord]:
        return self.registry.list_snapshots()

    def get_snapshot(self, tag: str) -> SnapshotRecord:
        return self.registry.get_snapshot(check_tag(tag))

    def _reserve_tag(self, tag: str) -> None:
        check_tag(tag)
        if tag in self._tags_in_flight:
            raise Conflict(f"a snapshot with tag {tag!r} is already being created")
        if self.registry.has_snapshot(tag) or (self.data.snapshots / tag).exists():
            raise Conflict(f"snapshot {tag!r} already exists; delete it first (forkd rmi {tag})")
        self._tags_in_flight.add(tag)

    def _resolve_boot_files(self, spec: SnapshotSpec) -> tuple[Image, Path, Path, Path]:
        image = load_image(self.data, spec.image)
        kernel, rootfs = image.kernel, image.rootfs
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
        return image, kernel, image.initrd, rootfs

    def _validate_spec(self, spec: SnapshotSpec) -> list[str]:
        bounds.MEM_MIB.check(spec.mem_mib)
        bounds.VCPUS.check(spec.vcpus)
        bounds.BOOT_WAIT_SECS.check(spec.boot_wait_secs)
        bounds.SETUP_TIMEOUT_SECS.check(spec.setup_timeout_secs)
        if spec.tap is not None:
            netns_mod.check_tap_name(spec.tap)
        warm = list(DEFAULT_WARM_IMPORTS if spec.warm_imports is None else spec.warm_imports)
        for mod in warm:
            if not bounds.MODULE_RE.match(mod):
                raise InvalidRequest(f"warm import {mod!r} is not a module name")
        for argv in spec.setup:
            if not argv or not all(isinstance(a, str) for a in argv):
                raise InvalidRequest("each setup command must be a non-empty list of strings")
        return warm

    async def create_snapshot(
        self, spec: SnapshotSpec, progress: Progress = _no_progress
    ) -> SnapshotRecord:
        """Boot a template, wait until its agent is warm, run setup, snapshot it."""
        warm = self._validate_spec(spec)
        image, kernel, initrd, rootfs = self._resolve_boot_files(spec)
        if spec.tap:
            self._check_host_tap_free(spec.tap)
        self._reserve_tag(spec.tag)
        if spec.tap:
            self._host_taps_busy.add(spec.tap)
        staging: SnapshotDir | None = None
        vm: VM | None = None
        try:
            host = await self.host_accel(image)
            config = VMConfig(spec.mem_mib, spec.vcpus, host)
            staging = layout.staging_dir(self.data.snapshots, spec.tag)
            backing_fmt = "qcow2" if rootfs.suffix == ".qcow2" else "raw"
            create_overlay(rootfs.resolve(), staging.disk, backing_fmt)
            progress("booting template", 0.05)
            vm, ping = await VM.boot(
                staging.path, config, mem_path=staging.mem, disk=staging.disk,
                kernel=kernel, initrd=initrd, append=kernel_cmdline(warm, accel=host),
                timeout=spec.boot_wait_secs, tap=spec.tap,
            )
            if ping.get("warm_errors"):
                raise InvalidRequest(f"warm imports failed in the guest: {ping['warm_errors']}")
            for i, argv in enumerate(spec.setup):
                progress(f"setup {i + 1}/{len(spec.setup)}: {' '.join(argv)[:60]}",
                         0.5 + 0.4 * i / max(1, len(spec.setup)))
                res = await vm.call("exec", timeout=spec.setup_timeout_secs + 30, args=argv,
                                    timeout_secs=spec.setup_timeout_secs)
                if res["exit_code"] != 0:
                    raise InvalidRequest(
                        f"setup command {argv} failed with exit code {res['exit_code']}: "
                        f"{(res.get('error') or res['stderr'] or res['stdout'])[-2000:]}"
                    )
            for code in spec.setup_eval:
                progress(f"setup eval: {code[:60]}", 0.88)
                res = await vm.call("eval", timeout=spec.setup_timeout_secs, code=code)
                if res["exit_code"] != 0:
                    raise InvalidRequest(f"setup_eval {code[:200]!r} failed: {res['error']}")
            progress("snapshotting", 0.9)
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
                "numpy_version": ping.get("numpy_version"),
                "python_version": ping.get("python_version"),
                "qemu_version": accel_mod.qemu_version(),
                "boot_secs": round(boot_s, 3),
                "save_state_ms": round(save_ms, 1),
                "parent_tag": None,
                "branched_from": None,
                # A NIC is part of the device config: children need a tap of this name.
                "tap": spec.tap,
            })
            final = layout.publish(staging, self.data.snapshots, spec.tag)
            staging = None
            record = SnapshotRecord(tag=spec.tag, dir=str(final.path), created_at_unix=created,
                                    meta={"config": config.to_json(), "tap": spec.tap})
            self.registry.insert_snapshot(record)
            progress("ready", 1.0)
            return record
        finally:
            if vm is not None:
                await vm.destroy()
            if staging is not None:
                shutil.rmtree(staging.path, ignore_errors=True)
            self._tags_in_flight.discard(spec.tag)
            if spec.tap:
                self._host_taps_busy.discard(spec.tap)

    def snapshot_lineage(self, tag: str) -> dict[str, Any]:
        snap = self.get_snapshot(tag)
        ancestors = []
        parent = snap.parent_tag
        while parent:
            ancestors.append(parent)
            try:
                parent = self.registry.get_snapshot(parent).parent_tag
            except NotFound:
                break
        return {**snap.info(), "parent_tag": snap.parent_tag, "ancestors": ancestors,
                "dependents": self._dependents(tag),
                "sandboxes": sorted(sb.id for sb in self.registry.list_sandboxes()
                                    if sb.snapshot_tag == tag)}

    def _dependents(self, tag: str) -> list[str]:
        """Snapshots whose disk chain runs through ``tag`` (all descendants)."""
        children: dict[str, list[str]] = {}
        for s in self.registry.list_snapshots():
            if s.parent_tag:
                children.setdefault(s.parent_tag, []).append(s.tag)
        out, todo = [], list(children.get(tag, []))
        while todo:
            t = todo.pop(0)
            out.append(t)
            todo.extend(children.get(t, []))
        return out

    async def delete_snapshot(self, tag: str, *, cascade: bool = False, force: bool = False) -> None:
        check_tag(tag)
        path = self.data.snapshots / tag
        registered = self.registry.has_snapshot(tag)
        if not registered and not path.exists():
            raise NotFound(f"snapshot {tag!r} is not registered")
        if tag in self._tags_in_flight:
            raise Conflict(f"snapshot {tag!r} is still being written")
        dependents = self._dependents(tag) if registered else []
        if dependents and not (cascade or force):
            raise Conflict(
                f"snapshot {tag!r} has dependent snapshots {dependents}: delete them first, "
                "or pass cascade=true to delete the subtree"
            )
        doomed = [*reversed(dependents), tag] if cascade else [tag]
        # A sandbox needs the snapshot it was forked from. (A branch's *source* does
        # not: it keeps its own copies of the layers; see Brancher.unpublish.)
        users = [sb.id for sb in self.registry.list_sandboxes() if sb.snapshot_tag in doomed]
        if users and not force:
            raise Conflict(
                f"sandboxes {users} are running from {tag!r}; kill them first or pass force=true"
            )
        for sb_id in users:
            await self.kill(sb_id)
        for t in doomed:
            self.brancher.unpublish(t)
            self.registry.delete_snapshot(t)
            shutil.rmtree(self.data.snapshots / t, ignore_errors=True)
            self.shm.remove(t)

    # ---------------------------------------------------------------- sandboxes

    def list_sandboxes(self) -> list[SandboxRecord]:
        return self.registry.list_sandboxes()

    def get_sandbox(self, sandbox_id: str) -> SandboxRecord:
        return self.registry.get_sandbox(check_sandbox_id(sandbox_id))

    def _snapshot_for_spawn(
        self, tag: str
    ) -> tuple[SnapshotRecord, SnapshotDir, VMConfig, str | None]:
        snap = self.get_snapshot(tag)
        if snap.status == "writing":
            raise Conflict(f"snapshot {tag!r} is still being written (status 'writing'); "
                           "wait until its status is 'ready'")
        if snap.status != "ready":
            raise Conflict(f"snapshot {tag!r} failed and cannot be forked: {snap.error}")
        sdir = SnapshotDir(Path(snap.dir))
        if not sdir.complete():
            raise VMError(f"snapshot {tag!r} is missing files under {sdir.path}")
        meta = sdir.read_meta()
        return snap, sdir, VMConfig.from_json(meta["config"]), meta.get("tap")

    # ------------------------------------------------- isolation: netns, taps

    def _check_host_tap_free(self, tap: str) -> None:
        """A tap in the daemon's own namespace, not attached to another VM of ours."""
        if not netns_mod.host_tap_exists(tap):
            raise InvalidRequest(netns_mod.missing_tap_message(tap))
        users = [sb.id for sb in self.registry.list_sandboxes()
                 if sb.netns is None and sb.meta.get("tap") == tap]
        if users or tap in self._host_taps_busy:
            raise Conflict(
                f"tap device {tap} is already in use by {users[0] if users else 'another VM'}; "
                "a tap serves one VM at a time: fork with per_child_netns=true to give each "
                "child its own namespace with its own tap"
            )

    def _reserve_netns(self, n: int) -> list[int]:
        """The ``n`` lowest forkd-child indices no live or in-flight sandbox holds."""
        used = {netns_mod.netns_index(sb.netns) for sb in self.registry.list_sandboxes()}
        indices = netns_mod.lowest_free({i for i in used if i is not None} | self._netns_reserved, n)
        self._netns_reserved.update(indices)
        return indices

    async def _check_netns(self, names: list[str], tap: str | None) -> None:
        needed = max(netns_mod.netns_index(name) or 0 for name in names) + 1
        setup = f"{netns_mod.SETUP_SCRIPT} {needed}" + (f" --tap {tap}" if tap else "")
        missing = [name for name in names if not netns_mod.netns_exists(name)]
        if missing:
            raise InvalidRequest(
                f"network namespace {missing[0]} does not exist ({len(missing)} of the "
                f"{len(names)} needed are missing; per_child_netns puts child i in the "
                f"pre-provisioned namespace forkd-child-<i>, here forkd-child-0..{needed - 1} are "
                f"needed); create them as root with: {setup}"
            )
        if tap:
            present = await asyncio.gather(
                *(asyncio.to_thread(netns_mod.netns_tap_exists, name, tap) for name in names))
            for name, ok in zip(names, present, strict=True):
                if not ok:
                    raise InvalidRequest(
                        f"{netns_mod.missing_tap_message(tap, name, needed)} (snapshot was "
                        f"taken with a NIC on tap {tap}, so every child needs a tap of that name)"
                    )

    async def _remove_cgroup(self, path: str | None) -> None:
        if path:
            await asyncio.to_thread(cgroups.handle_for(path).remove)

    # ---------------------------------------------------------------- spawn

    async def spawn(
        self, tag: str, n: int = 1, *, per_child_netns: bool = False,
        memory_limit_mib: int | None = None, live_fork: bool = False,
    ) -> list[SandboxRecord]:
        """Fork ``n`` children of snapshot ``tag`` in parallel; all or nothing."""
        bounds.SPAWN_N.check(n)
        if memory_limit_mib is not None:
            cgroups.validate_limit(memory_limit_mib)
            if cgroups.detect() == "none":
                raise InvalidRequest(f"{cgroups.NEEDS}; this host has neither")
        snap, sdir, config, tap = self._snapshot_for_spawn(tag)
        if tap and not per_child_netns and n != 1:
            raise InvalidRequest(
                f"snapshot {tag!r} has a NIC on tap {tap}, and a tap serves one VM at a time: "
                f"fork it with per_child_netns=true (each child gets forkd-child-<i> with its own "
                f"{tap}; {netns_mod.SETUP_SCRIPT} N --tap {tap} creates them), or fork one child"
            )
        host = await self._host_accel_for(sdir)
        check_compatible(config.accel, host, tag)

        # Claim namespaces / the host tap with no await in between checks and claims.
        netns_names: list[str | None] = [None] * n
        reserved: list[int] = []
        host_tap: str | None = None
        if per_child_netns:
            reserved = self._reserve_netns(n)
            netns_names = [netns_mod.child_netns(i) for i in reserved]
        elif tap:
            self._check_host_tap_free(tap)
            host_tap = tap
            self._host_taps_busy.add(tap)
        try:
            if per_child_netns:
                await self._check_netns([name for name in netns_names if name], tap)
            mem = await self.shm.ensure(tag, sdir.mem) if live_fork else sdir.mem
            prefix = layout.new_batch_prefix()
            ids = [f"{prefix}-{i:04d}" for i in range(n)]
            gate = asyncio.Semaphore(SPAWN_PARALLELISM)

            async def one(sb_id: str, netns: str | None) -> SandboxRecord:
                async with gate:
                    return await self._restore_child(sb_id, snap, sdir, config, netns=netns,
                                                      tap=tap, memory_limit_mib=memory_limit_mib,
                                                      mem=mem, live_fork=live_fork)

            results = await asyncio.gather(*(one(i, ns) for i, ns in zip(ids, netns_names, strict=True)),
                                           return_exceptions=True)
        finally:
            self._netns_reserved.difference_update(reserved)
            if host_tap:
                self._host_taps_busy.discard(host_tap)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            # All or nothing: a partial batch would leave the caller with ids it never saw.
            await asyncio.gather(*(self.kill(r.id) for r in results
                                   if isinstance(r, SandboxRecord)), return_exceptions=True)
            first = failures[0]
            if isinstance(first, ForkdError):
                raise first
            raise VMError(f"fork failed: {type(first).__name__}: {first}") from first
        return [r for r in results if isinstance(r, SandboxRecord)]

    async def _restore_child(
        self, sb_id: str, snap: SnapshotRecord, sdir: SnapshotDir, config: VMConfig, *,
        netns: str | None = None, tap: str | None = None, memory_limit_mib: int | None = None,
        mem: Path | None = None, live_fork: bool = False,
    ) -> SandboxRecord:
        run_dir = self.data.sandboxes / sb_id
        run_dir.mkdir(parents=True)
        cgroup: cgroups.CgroupHandle | None = None
        launcher: list[str] = []
        try:
            if memory_limit_mib is not None:
                cgroup = cgroups.create(sb_id, memory_limit_mib)
                # Before QEMU exists: a daemon that dies now still finds it on restart.
                (run_dir / "cgroup").write_text(f"{cgroup.path}\n")
                launcher += cgroup.launcher()
            if netns:
                launcher += netns_mod.launcher(netns)
            clone_overlay(sdir.disk, run_dir / "disk.qcow2", sdir.path / ".child-overlay.qcow2")
            vm = await VM.restore(run_dir, config, mem_path=mem or sdir.mem, state_path=sdir.state,
                                  disk=run_dir / "disk.qcow2", tap=tap, launcher=launcher)
        except BaseException:
            if cgroup is not None:
                cgroup.remove()  # VM.restore killed and reaped QEMU before raising
            shutil.rmtree(run_dir, ignore_errors=True)
            raise
        meta: dict[str, Any] = {"config": config.to_json(), "timings": vm.timings}
        if cgroup is not None:
            meta["cgroup"] = str(cgroup.path)
        if tap:
            meta["tap"] = tap
        record = SandboxRecord(
            id=sb_id, snapshot_tag=snap.tag, dir=str(run_dir), created_at_unix=now_unix(),
            pid=vm.pid, netns=netns, memory_limit_mib=memory_limit_mib, live_fork=live_fork,
            meta=meta,
        )
        self.vms[sb_id] = vm
        self.registry.insert_sandbox(record)
        return record

    async def kill(self, sandbox_id: str) -> None:
        check_sandbox_id(sandbox_id)
        vm = self.vms.pop(sandbox_id, None)
        try:
            record = self.registry.get_sandbox(sandbox_id)
        except NotFound:
            if vm is None:
                raise
            record = None
        if vm is not None:
            await vm.destroy()
        elif record is not None:
            kill_pid_now(record.pid or 0, Path(record.dir))
        if record is not None:
            await self._remove_cgroup(record.meta.get("cgroup"))
        self.registry.delete_sandbox(sandbox_id)
        run_dir = self.data.sandboxes / sandbox_id
        shutil.rmtree(run_dir, ignore_errors=True)

    def _vm(self, sandbox_id: str) -> VM:
        check_sandbox_id(sandbox_id)
        vm = self.vms.get(sandbox_id)
        if vm is None:
            raise NotFound(f"sandbox {sandbox_id!r} is not alive")
        if not vm.process.alive():
            raise GuestError(f"sandbox {sandbox_id!r} has died (its QEMU exited); kill it to clean up")
        return vm

    async def _call(self, sandbox_id: str, action: str, timeout: float, **args: Any) -> dict[str, Any]:
        """One agent request. A QEMU that died before the event loop reaped it shows up
        as a reset agent connection; report that as the sandbox's death, by id."""
        vm = self._vm(sandbox_id)
        try:
            return await vm.call(action, timeout=timeout, **args)
        except GuestError as exc:
            if vm.process.alive() and pid_is_qemu(vm.pid, vm.process.dir):
                raise
            raise GuestError(
                f"sandbox {sandbox_id!r} has died (its QEMU exited); kill it to clean up"
            ) from exc

    async def ping(self, sandbox_id: str) -> dict[str, Any]:
        return await self._call(sandbox_id, "ping", timeout=30)

    async def exec(
        self, sandbox_id: str, args: list[str], timeout_secs: float = 30, env: dict | None = None,
        cwd: str | None = None, stdin: str | None = None, max_output_bytes: int | None = None,
    ) -> dict[str, Any]:
        if not args or not all(isinstance(a, str) for a in args):
            raise InvalidRequest("args must be a non-empty list of strings")
        bounds.EXEC_TIMEOUT_SECS.check(timeout_secs)
        req: dict[str, Any] = {"args": args, "timeout_secs": timeout_secs}
        for key, value in (("env", env), ("cwd", cwd), ("stdin", stdin),
                           ("max_output_bytes", max_output_bytes)):
            if value is not None:
                req[key] = value
        # The agent enforces the timeout; ours only catches a wedged guest.
        return await self._call(sandbox_id, "exec", timeout=timeout_secs + 30, **req)

    async def eval(self, sandbox_id: str, code: str, timeout_secs: float = 60) -> dict[str, Any]:
        if not isinstance(code, str):
            raise InvalidRequest("code must be a string")
        return await self._call(sandbox_id, "eval", timeout=timeout_secs, code=code)

    async def branch(self, sandbox_id: str, tag: str | None = None, mode: str = "full",
                     wait: bool = True) -> SnapshotRecord:
        """Snapshot a running sandbox into ``tag`` and let it carry on (see controller/branch.py)."""
        return await self.brancher.branch(sandbox_id, tag, mode, wait)

