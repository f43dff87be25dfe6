"""`SandboxDiffs`: what a sandbox's filesystem changed, found from its disk layers, not by hashing.

A child's disk is a qcow2 overlay chain over its snapshot's disk, so the layers
above the image both sides share hold every block either side wrote
(``vmm/disk_view.changed_ranges``). Of those blocks, the inode-table ones name
every inode whose metadata changed (a write changes its file's mtime, a new or
deleted name its directory's, a chmod or chown the inode), so only those inodes
are compared, on the host, with debugfs (``host/extfs``), never with the guest's
help: the guest is only asked to freeze its filesystem (flushed, journal
checkpointed) while its disk is read, so the host reads a whole state.

Every path comes from the guest's disk and is only ever reported or handed back
to a guest: none names a file on the host. Two sides with no image in common
(different guest images) cannot be told apart by layers: that is refused (409)
rather than walked.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from forkd.controller.agent_gateway import AgentGateway
from forkd.controller.results import FsChange, FsDiff
from forkd.controller.sandboxes import SandboxTable
from forkd.controller.snapshots import SnapshotStore
from forkd.errors import Conflict, GuestError, InvalidRequest, TooLarge
from forkd.guest import protocol
from forkd.host import extfs
from forkd.vmm import disk_view

# What a diff leaves out unless asked: kernel and runtime filesystems, scratch space, caches.
DEFAULT_EXCLUDE = ("/proc", "/sys", "/dev", "/run", "/tmp", "/var/tmp", "/var/cache", "/var/log",
                   "/lost+found", "/root/.cache", "__pycache__", ".pytest_cache", ".cache", ".mypy_cache")
MAX_FILTERS = 64
FREEZE_TIMEOUT_SECS = 30.0
# A file's content is read whole (to compare it, or for a patch, tar or apply) up to this size.
MAX_FILE_BYTES = 64 << 20
# And all the content one request reads, together.
MAX_TOTAL_BYTES = 256 << 20

_KIND = {"regular": "file", "directory": "dir", "symlink": "symlink"}


def check_filters(values: Iterable[str] | None, name: str) -> list[str]:
    """include/exclude entries: an absolute path prefix (``/work``) or a name any part of a path
    may match (``__pycache__``, ``*.pyc``)."""
    out: list[str] = []
    for value in values or ():
        if len(out) >= MAX_FILTERS:
            raise InvalidRequest(f"at most {MAX_FILTERS} {name} entries")
        if not isinstance(value, str) or not value or len(value) > protocol.FILE_PATH_MAX or "\x00" in value:
            raise InvalidRequest(f"{name} entries are non-empty paths or names")
        if value.startswith("/"):
            cleaned = extfs.clean_path(value.encode())
            if not cleaned:
                raise InvalidRequest(f"{name} entry {value[:200]!r} is not a plain absolute path "
                                     "(printable, no '.' or '..' parts)")
            value = cleaned
        out.append(value)
    return out


def matches(path: str, entries: Iterable[str]) -> bool:
    """Whether ``path`` is under one of the prefixes, or one of its parts matches one of the names."""
    parts = path.strip("/").split("/")
    for entry in entries:
        if entry.startswith("/"):
            if entry == "/" or path == entry or path.startswith(entry + "/"):
                return True
        elif any(fnmatch.fnmatchcase(part, entry) for part in parts):
            return True
    return False


@dataclass
class Change:
    """A path whose state differs; ``old``/``new`` None where it does not exist on that side."""

    path: str
    old: extfs.InodeStat | None
    new: extfs.InodeStat | None
    content_changed: bool = False
    old_target: str | None = None
    new_target: str | None = None

    @property
    def status(self) -> str:
        return "added" if self.old is None else "deleted" if self.new is None else "modified"

    def info(self) -> FsChange:
        side = self.new or self.old
        assert side is not None
        out: FsChange = {"path": self.path, "type": _KIND.get(side.kind, "other"), "size": side.size,
                         "mode": side.mode, "uid": side.uid, "gid": side.gid,
                         "content_changed": self.content_changed}
        if self.old is not None and self.new is not None:
            for key, before, after in (("old_mode", self.old.mode, self.new.mode),
                                       ("old_uid", self.old.uid, self.new.uid),
                                       ("old_gid", self.old.gid, self.new.gid)):
                if before != after:
                    out[key] = before  # type: ignore[literal-required]
        target = self.new_target if self.new is not None else self.old_target
        if target is not None:
            out["target"] = target
        return out


@dataclass
class OpenDiff:
    """The changes between two states, with both disks readable for the time of the ``with``."""

    sandbox_id: str
    against: str
    old_view: Path
    new_view: Path
    changes: list[Change]
    skipped: int
    started: float
    _read: int = field(default=0)

    def result(self) -> FsDiff:
        by: dict[str, list[FsChange]] = {"added": [], "modified": [], "deleted": []}
        for change in self.changes:
            by[change.status].append(change.info())
        return {"sandbox_id": self.sandbox_id, "against": self.against, "method": "layers",
                "added": by["added"], "modified": by["modified"], "deleted": by["deleted"],
                "skipped": self.skipped, "elapsed_ms": round((time.monotonic() - self.started) * 1000, 1)}

    async def content(self, stat: extfs.InodeStat, *, new: bool) -> bytes:
        """A regular file's content on one side (bounded per file and per request: 413)."""
        if stat.size > MAX_FILE_BYTES:
            raise TooLarge(f"a changed file is larger than {MAX_FILE_BYTES} bytes")
        self._read += stat.size
        if self._read > MAX_TOTAL_BYTES:
            raise TooLarge(f"the changed files add up to more than {MAX_TOTAL_BYTES} bytes")
        data = await extfs.read_inode(self.new_view if new else self.old_view, stat.ino, stat.size)
        if len(data) != stat.size:
            raise GuestError(f"inode {stat.ino} read {len(data)} bytes, not its size {stat.size}")
        return data


class SandboxDiffs:
    """Diffs of a sandbox against its snapshot, another snapshot, or another sandbox."""

    def __init__(self, table: SandboxTable, snapshots: SnapshotStore, agents: AgentGateway,
                 tmp: Path) -> None:
        self._tmp = tmp  # the data dir's tmp: where its disk views' throwaway overlays go
        self._table = table
        self._snapshots = snapshots
        self._agents = agents

    def base_tag(self, sandbox_id: str) -> str:
        """The snapshot a sandbox was forked from (``against=parent``)."""
        return self._table.records.get(self._table.resolve(sandbox_id)).snapshot_tag

    async def diff(self, sandbox_id: str, against: str = "parent", *, include: list[str] | None = None,
                   exclude: list[str] | None = None) -> FsDiff:
        async with self.opened(sandbox_id, against, include=include, exclude=exclude) as opened:
            return opened.result()

    @contextlib.asynccontextmanager
    async def opened(self, sandbox_id: str, against: str = "parent", *, include: list[str] | None = None,
                     exclude: list[str] | None = None) -> AsyncIterator[OpenDiff]:
        """The changes of ``sandbox_id`` against ``against`` (parent | snapshot:TAG | sandbox:ID), both
        disks readable (and both sandboxes' filesystems frozen) until the ``with`` ends."""
        started = time.monotonic()
        includes = check_filters(include, "include") or ["/"]
        excludes = check_filters(DEFAULT_EXCLUDE if exclude is None else exclude, "exclude")
        sandbox_id = self._table.resolve(sandbox_id)
        other: str | None = None
        if against == "parent":
            against = f"snapshot:{self.base_tag(sandbox_id)}"
        kind, sep, name = against.partition(":")
        if not sep or kind not in ("snapshot", "sandbox") or not name:
            raise InvalidRequest("against is parent, snapshot:TAG or sandbox:ID")
        if kind == "sandbox":
            other = self._table.resolve(name)
            if other == sandbox_id:
                raise InvalidRequest("a sandbox diffed against itself has no changes to show")
            against = f"sandbox:{other}"
        else:
            tag = self._snapshots.resolve(name)
            against = f"snapshot:{tag}"
            old_top = self._snapshots.forkable(tag).dir.disk
        async with contextlib.AsyncExitStack() as stack:
            for frozen in (sandbox_id, other):
                if frozen is not None:
                    await stack.enter_async_context(self._frozen(frozen))
            new_top = Path(self._table.records.get(sandbox_id).disk.file)
            if other is not None:
                old_top = Path(self._table.records.get(other).disk.file)
            new_chain, old_chain = await asyncio.gather(disk_view.chain(new_top), disk_view.chain(old_top))
            new_above, old_above = _above_common(new_chain, old_chain, against, self._copies())
            new_ranges, old_ranges = await asyncio.gather(disk_view.changed_ranges(new_top, new_above),
                                                          disk_view.changed_ranges(old_top, old_above))
            new_disk, old_disk = await stack.enter_async_context(
                disk_view.exported([new_chain[0], old_chain[0]], self._tmp))
            new_view, old_view = new_disk.path, old_disk.path
            changes, skipped = await compare(old_view, new_view, [*new_ranges, *old_ranges,
                                                                  *new_disk.replayed, *old_disk.replayed])
            changes = [c for c in changes if matches(c.path, includes) and not matches(c.path, excludes)]
            opened = OpenDiff(sandbox_id, against, old_view, new_view, changes, skipped, started)
            await _settle_content(opened)
            opened.changes = [c for c in opened.changes if c.status != "modified" or c.content_changed
                              or c.info().keys() & {"old_mode", "old_uid", "old_gid"}]
            yield opened

    def _copies(self) -> dict[Path, Path]:
        """Each branch's copies of its source's frozen overlays, by the source's file: the source
        goes on over its own frozen overlay, its children over the snapshot's copy, the same
        content at the same place in the chain (controller/branch.py, vmm/disk.copy_layers)."""
        copies: dict[Path, Path] = {}
        for snap in self._snapshots.all():
            layers = snap.source_layers
            for i, layer in enumerate(layers):
                name = "disk.qcow2" if i == len(layers) - 1 else f"layer-{i}.qcow2"
                with contextlib.suppress(OSError):
                    copies[Path(layer).resolve()] = (Path(snap.dir) / name).resolve()
        return copies

    @contextlib.asynccontextmanager
    async def _frozen(self, sandbox_id: str) -> AsyncIterator[None]:
        """The guest's root filesystem frozen (FIFREEZE: everything flushed, the journal
        checkpointed to the blocks' homes, new writes held) for the time of the ``with``."""
        await self._agents.call(sandbox_id, lambda agent: agent.fsfreeze(FREEZE_TIMEOUT_SECS))
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                await self._agents.call(sandbox_id, lambda agent: agent.fsthaw(FREEZE_TIMEOUT_SECS))


def _above_common(new_chain: list[tuple[Path, str]], old_chain: list[tuple[Path, str]],
                  against: str, copies: dict[Path, Path]) -> tuple[int, int]:
    """How many layers of each chain lie above the newest image both share (an image and a branch's
    copy of it count as one)."""
    old_index = {copies.get(path, path): i for i, (path, _) in enumerate(old_chain)}
    for i, (path, _) in enumerate(new_chain):
        if copies.get(path, path) in old_index:
            return i, old_index[copies.get(path, path)]
    raise Conflict(f"the sandbox's disk and {against}'s share no image (different guest images): "
                   "their layers cannot tell what changed")


async def compare(old_view: Path, new_view: Path,
                  ranges: list[tuple[int, int]]) -> tuple[list[Change], int]:
    """The paths whose state differs between two views of one filesystem, looking only at the
    inodes in the inode-table blocks of ``ranges``. Also: how many changed names were skipped."""
    geometry = extfs.parse_geometry(await extfs.run_debugfs(new_view, ["stats"]))
    candidates = extfs.inodes_in_ranges(geometry, ranges)
    old_stats, new_stats = await asyncio.gather(extfs.stat_inodes(old_view, candidates),
                                                extfs.stat_inodes(new_view, candidates))
    changed = {ino for ino in candidates if _differs(old_stats.get(ino), new_stats.get(ino))}
    old_live = {i for i in changed if (s := old_stats.get(i)) is not None and s.live}
    new_live = {i for i in changed if (s := new_stats.get(i)) is not None and s.live}
    old_dirs = {i for i in old_live if old_stats[i].kind == "directory"}
    new_dirs = {i for i in new_live if new_stats[i].kind == "directory"}
    old_paths, new_paths, old_lists, new_lists = await asyncio.gather(
        extfs.paths_of(old_view, old_live), extfs.paths_of(new_view, new_live),
        extfs.list_dirs(old_view, old_dirs), extfs.list_dirs(new_view, new_dirs))
    skipped = sum(1 for entries in (*old_lists.values(), *new_lists.values()) for e in entries if not e.name)
    sides = [_Side(old_paths, old_lists), _Side(new_paths, new_lists)]
    paths = {p for side in sides for p in side.by_path}
    for side in sides:  # names added to or removed from a changed directory
        for dir_ino, entries in side.lists.items():
            for dir_path in side.by_ino.get(dir_ino, []):
                for entry in entries:
                    if entry.name:
                        paths.add(f"{dir_path.rstrip('/')}/{entry.name}")
    located = {p: (sides[0].locate(p, sides[1]), sides[1].locate(p, sides[0])) for p in paths}
    more_old = {o for o, _ in located.values() if o is not None} - old_stats.keys()
    more_new = {n for _, n in located.values() if n is not None} - new_stats.keys()
    extra_old, extra_new = await asyncio.gather(extfs.stat_inodes(old_view, more_old),
                                                extfs.stat_inodes(new_view, more_new))
    old_stats |= extra_old
    new_stats |= extra_new
    changes: list[Change] = []
    for path in sorted(located):
        old_ino, new_ino = located[path]
        old = old_stats.get(old_ino) if old_ino is not None else None
        new = new_stats.get(new_ino) if new_ino is not None else None
        old = old if old is not None and old.live else None
        new = new if new is not None and new.live else None
        if old is None and new is None:
            continue
        if old is not None and new is not None and old.ino == new.ino and old.same(new):
            continue
        if (old is not None and new is not None and old.kind == new.kind == "directory"
                and (old.mode, old.uid, old.gid) == (new.mode, new.uid, new.gid)):
            continue  # only its entries changed: those are reported themselves
        changes.append(Change(path, old, new))
    return changes, skipped


def _differs(old: extfs.InodeStat | None, new: extfs.InodeStat | None) -> bool:
    if old is None or new is None:
        return (old is not None and old.live) or (new is not None and new.live)
    if not old.live and not new.live:
        return False
    return not old.same(new)


@dataclass
class _Side:
    """One side's path to inode map, from its changed inodes' names and its changed directories."""

    by_ino: dict[int, list[str]]
    lists: dict[int, list[extfs.DirEntry]]
    by_path: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        if extfs.ROOT_INODE in self.lists:  # ncheck names no path for the root itself
            self.by_ino.setdefault(extfs.ROOT_INODE, ["/"])
        self.by_path = {p: ino for ino, ps in self.by_ino.items() for p in ps}
        self._dir_of = {p: ino for p, ino in self.by_path.items() if ino in self.lists}

    def locate(self, path: str, other: _Side) -> int | None:
        """The inode ``path`` names on this side, or None where it does not exist.

        Its own changed inodes' names first; else its parent directory: a changed one was listed.
        A directory changed on the other side only is a changed inode on both (the two sides'
        inodes are compared), so it is listed here too unless this side has no such directory.
        A directory changed on neither side holds the same entries on both: the path names the
        inode it names there, unless that inode changed here and this is not one of its names (a
        directory's entries can change without its inode: debugfs does that)."""
        if path in self.by_path:
            return self.by_path[path]
        parent, _, name = path.rpartition("/")
        parent = parent or "/"
        dir_ino = self._dir_of.get(parent)
        if dir_ino is not None:
            return next((e.ino for e in self.lists[dir_ino] if e.name == name), None)
        if parent in other._dir_of:
            return None
        ino = other.by_path.get(path)
        if ino is not None and ino in self.by_ino:
            return None  # a changed inode that has other names here: this one is gone
        return ino


async def _settle_content(opened: OpenDiff) -> None:
    """Decide ``content_changed`` of every modified file, reading content only where the inodes
    alone cannot tell (the same size, a different mtime or inode)."""
    for change in opened.changes:
        old, new = change.old, change.new
        if new is not None and new.kind == "symlink":
            change.new_target = await extfs.link_target(opened.new_view, new.ino, new.size)
        if old is not None and old.kind == "symlink":
            change.old_target = await extfs.link_target(opened.old_view, old.ino, old.size)
        if old is None or new is None:
            change.content_changed = True
            continue
        if old.kind != new.kind:
            change.content_changed = True
        elif new.kind == "symlink":
            change.content_changed = change.old_target != change.new_target
        elif new.kind == "regular":
            if old.size != new.size:
                change.content_changed = True
            elif old.ino == new.ino and old.mtime == new.mtime:
                change.content_changed = False
            else:
                change.content_changed = (await opened.content(old, new=False)
                                          != await opened.content(new, new=True))
