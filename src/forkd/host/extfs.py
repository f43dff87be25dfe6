"""An ext4 guest disk read from the host with debugfs, treated as hostile input.

A sandbox's disk image is written by its guest, so everything read from it is
bounded before it is parsed: every debugfs run has a deadline and a cap on its
output, and each parser refuses (or skips) what is not debugfs's own format.
Nothing read here ever names a host path: debugfs is only handed the image and
inode numbers (``<N>``), never a path from the guest, and its output is kept in
memory, so a crafted name cannot reach the host's filesystem.

What the module knows of ext4 is only what maps disk blocks to inodes: the
geometry (block size, inodes per group, each group's inode table), so that a
range of the disk an overlay changed names the inodes whose metadata changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from forkd.errors import GuestError, VMError
from forkd.host.bounded_output import bounded_stdout

DEBUGFS_TIMEOUT_SECS = 20.0
# A listing or a batch of stats of a few thousand inodes is well under this.
DEBUGFS_MAX_OUTPUT = 64 << 20
# The inodes one diff looks at (each changed inode-table block names 16 of them).
MAX_INODES = 200_000
FIRST_INODE = 11  # below it: ext4's reserved inodes (journal, resize, ...); 2 (the root) is kept
ROOT_INODE = 2


def debugfs_tool() -> str:
    # /usr/sbin is not on every PATH (a user's shell).
    tool = shutil.which("debugfs") or ("/usr/sbin/debugfs" if Path("/usr/sbin/debugfs").exists() else None)
    if tool is None:
        raise VMError("debugfs is not installed (apt-get install e2fsprogs): the diff reads guest disks "
                      "with it")
    return tool


async def run_debugfs(image: Path, commands: Iterable[str], *, timeout: float = DEBUGFS_TIMEOUT_SECS,
                      max_output: int = DEBUGFS_MAX_OUTPUT) -> bytes:
    """Run ``commands`` (one per line) in one read-only debugfs on ``image``; its output, bounded.

    ``-c``: catastrophic mode, the bitmaps are not read (faster, and a damaged bitmap does not stop
    it). Output beyond ``max_output`` or a run past ``timeout`` is refused (502: the disk is its
    guest's, so a disk that makes debugfs run away is the guest's doing).
    """
    script = "".join(f"{command}\n" for command in commands).encode()
    proc = await asyncio.create_subprocess_exec(
        debugfs_tool(), "-c", "-f", "-", str(image), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None
    stdin = proc.stdin

    async def feed() -> None:
        # Beside the reads: a long script and a long answer would otherwise wait on each other.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            stdin.write(script)
            await stdin.drain()
        stdin.close()

    feeding = asyncio.create_task(feed())
    try:
        return await bounded_stdout(proc, timeout=timeout, max_output=max_output, refuse=GuestError,
                                    what="debugfs on the guest's disk")
    finally:
        feeding.cancel()
        with contextlib.suppress(BaseException):
            await feeding


def split_commands(output: bytes, commands: list[str]) -> list[bytes]:
    """The output of each command of a ``-f`` run, by the ``debugfs: CMD`` line it echoes.

    Markers are looked for in order, each after the previous one, so a guest's text that imitates
    one only ever shifts what its own inode reports (debugfs prints inode numbers we chose, and a
    forged block can only describe the guest's own disk, which it controls anyway).
    """
    parts: list[bytes] = []
    starts: list[int] = []
    pos = 0
    for command in commands:
        marker = f"debugfs: {command}\n".encode()
        at = output.find(marker, pos)
        if at < 0:
            raise GuestError(f"debugfs's output lacks the answer to {command!r}")
        starts.append(at + len(marker))
        pos = at + len(marker)
    for i, start in enumerate(starts):
        end = starts[i + 1] - len(f"debugfs: {commands[i + 1]}\n") if i + 1 < len(starts) else len(output)
        parts.append(output[start:end])
    return parts


@dataclass(frozen=True)
class Geometry:
    """Where an ext4 filesystem keeps its inodes: enough to name the inodes in a block."""

    block_size: int
    inode_size: int
    inodes_per_group: int
    inode_count: int
    inode_tables: tuple[int, ...]  # each group's first inode-table block, group 0 first

    @property
    def table_blocks(self) -> int:
        return -(-self.inodes_per_group * self.inode_size // self.block_size)


_FIELD = re.compile(rb"^(Block size|Inode size|Inodes per group|Inode count):\s+(\d+)\s*$", re.M)
_GROUP = re.compile(rb"^ Group\s+(\d+): block bitmap at \d+, inode bitmap at \d+, inode table at (\d+)", re.M)


def parse_geometry(stats: bytes) -> Geometry:
    """Geometry from debugfs's ``stats`` (refused when a field is missing or absurd)."""
    fields = {m.group(1).decode(): int(m.group(2)) for m in _FIELD.finditer(stats)}
    tables: dict[int, int] = {}
    for m in _GROUP.finditer(stats):
        tables.setdefault(int(m.group(1)), int(m.group(2)))
    try:
        geometry = Geometry(block_size=fields["Block size"], inode_size=fields["Inode size"],
                            inodes_per_group=fields["Inodes per group"], inode_count=fields["Inode count"],
                            inode_tables=tuple(tables[g] for g in range(len(tables))))
    except KeyError as exc:
        raise GuestError(f"the guest's disk is not an ext filesystem debugfs can read ({exc})") from None
    if (geometry.block_size not in (1024, 2048, 4096, 8192, 16384, 32768, 65536)
            or geometry.inode_size not in (128, 256, 512, 1024) or geometry.inodes_per_group <= 0
            or not geometry.inode_tables):
        raise GuestError("the guest's disk has an ext geometry debugfs's reader does not accept")
    return geometry


def inodes_in_ranges(geometry: Geometry, ranges: Iterable[tuple[int, int]], *,
                     limit: int = MAX_INODES) -> set[int]:
    """The inode numbers whose inode-table slots lie in the byte ``ranges`` (start, length) of the disk.

    A write to a file changes its inode (mtime, size), a new or deleted file its inode and its
    directory's, a chmod or chown the inode: so the inode-table blocks an overlay holds name every
    inode that may differ. Reserved inodes (journal, resize) are left out, the root kept.
    """
    per_block = geometry.block_size // geometry.inode_size
    table_blocks = geometry.table_blocks
    spans = sorted((start, start + table_blocks) for start in geometry.inode_tables)
    group_of = {start: g for g, start in enumerate(geometry.inode_tables)}
    found: set[int] = set()
    for offset, length in ranges:
        if length <= 0:
            continue
        first = offset // geometry.block_size
        last = (offset + length - 1) // geometry.block_size
        for start, end in spans:
            lo, hi = max(first, start), min(last, end - 1)
            for block in range(lo, hi + 1):
                base = group_of[start] * geometry.inodes_per_group + (block - start) * per_block
                for ino in range(base + 1, base + per_block + 1):
                    if ino > geometry.inode_count:
                        break
                    if ino >= FIRST_INODE or ino == ROOT_INODE:
                        found.add(ino)
                if len(found) > limit:
                    raise GuestError(f"the disk changed more than {limit} inodes: too many to diff")
    return found


@dataclass(frozen=True)
class InodeStat:
    """What a diff compares of an inode (from debugfs's ``stat``)."""

    ino: int
    kind: str  # regular | directory | symlink | other
    mode: int  # permission bits (07777)
    uid: int
    gid: int
    size: int
    links: int
    mtime: str
    ctime: str

    @property
    def live(self) -> bool:
        return self.links > 0

    def same(self, other: InodeStat) -> bool:
        return (self.kind, self.mode, self.uid, self.gid, self.size, self.links, self.mtime, self.ctime) == (
            other.kind, other.mode, other.uid, other.gid, other.size, other.links, other.mtime, other.ctime)


_KINDS = {b"regular": "regular", b"directory": "directory", b"symlink": "symlink"}
_STAT_HEAD = re.compile(rb"^Inode: (\d+)\s+Type: (\S+)\s+Mode:\s+(\d+)\s", re.M)
_STAT_OWNER = re.compile(rb"^User:\s+(\d+)\s+Group:\s+(\d+)\s.*Size: (\d+)\s*$", re.M)
_STAT_LINKS = re.compile(rb"^Links: (\d+)\s", re.M)
_STAT_TIME = re.compile(rb"^\s*(ctime|mtime): (0x[0-9a-f]+(?::[0-9a-f]+)?)", re.M)


def parse_stat(ino: int, block: bytes) -> InodeStat | None:
    """One ``stat <ino>`` answer; None for an inode debugfs cannot read (never used, out of range).

    Only the fixed header lines are read (before any xattr or link target the guest chose), and the
    header must name the inode asked for.
    """
    head = block[:2048]
    m = _STAT_HEAD.search(head)
    owner = _STAT_OWNER.search(head)
    links = _STAT_LINKS.search(head)
    times = {t.group(1).decode(): t.group(2).decode() for t in _STAT_TIME.finditer(head)}
    if m is None or owner is None or links is None or int(m.group(1)) != ino:
        return None
    return InodeStat(ino=ino, kind=_KINDS.get(m.group(2), "other"), mode=int(m.group(3), 8) & 0o7777,
                     uid=int(owner.group(1)), gid=int(owner.group(2)), size=int(owner.group(3)),
                     links=int(links.group(1)), mtime=times.get("mtime", ""), ctime=times.get("ctime", ""))


async def stat_inodes(image: Path, inodes: Iterable[int]) -> dict[int, InodeStat]:
    """``stat`` of each inode (those debugfs cannot read are left out)."""
    wanted = sorted(set(inodes))
    if not wanted:
        return {}
    commands = [f"stat <{ino}>" for ino in wanted]
    parts = split_commands(await run_debugfs(image, commands), commands)
    out: dict[int, InodeStat] = {}
    for ino, block in zip(wanted, parts, strict=True):
        stat = parse_stat(ino, block)
        if stat is not None:
            out[ino] = stat
    return out


@dataclass(frozen=True)
class DirEntry:
    ino: int
    mode: int  # st_mode: type and permission bits
    uid: int
    gid: int
    name: str


def parse_ls(block: bytes) -> list[DirEntry]:
    """``ls -p`` lines, ``/ino/mode/uid/gid/name/size/``. A name cannot hold ``/``, so a line of a
    crafted name cannot pass for another entry; names that are not printable UTF-8 are skipped
    (the caller counts them) and ``.``/``..`` left out."""
    entries: list[DirEntry] = []
    for line in block.split(b"\n"):
        fields = line.split(b"/")
        if len(fields) != 8 or fields[0] or fields[7]:
            continue
        ino, mode, uid, gid, raw_name = fields[1:6]
        if not (ino.isdigit() and mode.isdigit() and uid.isdigit() and gid.isdigit()):
            continue
        try:
            name = raw_name.decode()
        except UnicodeDecodeError:
            name = ""
        if name in ("", ".", "..") or not name.isprintable():
            if name not in (".", ".."):
                entries.append(DirEntry(int(ino), int(mode, 8), int(uid), int(gid), ""))
            continue
        entries.append(DirEntry(int(ino), int(mode, 8), int(uid), int(gid), name))
    return entries


async def list_dirs(image: Path, inodes: Iterable[int]) -> dict[int, list[DirEntry]]:
    """``ls -p`` of each directory inode."""
    wanted = sorted(set(inodes))
    if not wanted:
        return {}
    commands = [f"ls -p <{ino}>" for ino in wanted]
    parts = split_commands(await run_debugfs(image, commands), commands)
    return {ino: parse_ls(block) for ino, block in zip(wanted, parts, strict=True)}


def clean_path(raw: bytes) -> str | None:
    """A guest path as the diff reports it: absolute, normalised, printable UTF-8; else None."""
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        return None
    parts = [p for p in text.split("/") if p]
    if any(p in (".", "..") or not p.isprintable() for p in parts):
        return None
    return "/" + "/".join(parts)


def parse_ncheck(block: bytes, asked: set[int]) -> dict[int, list[str]]:
    """``ncheck`` lines ``ino<TAB>path``, for the inodes asked only; unprintable paths dropped."""
    found: dict[int, list[str]] = {}
    for line in block.split(b"\n"):
        ino_text, tab, raw = line.partition(b"\t")
        if not tab or not ino_text.isdigit() or not raw.startswith(b"/"):
            continue
        ino = int(ino_text)
        path = clean_path(raw)
        if ino in asked and path is not None and path != "/":
            found.setdefault(ino, []).append(path)
    return found


async def paths_of(image: Path, inodes: Iterable[int]) -> dict[int, list[str]]:
    """Every path of each inode (one directory scan for them all)."""
    wanted = sorted(set(inodes))
    if not wanted:
        return {}
    found: dict[int, list[str]] = {}
    # One scan per thousand inodes keeps the command line short.
    for i in range(0, len(wanted), 1000):
        chunk = wanted[i:i + 1000]
        command = "ncheck " + " ".join(str(ino) for ino in chunk)
        out = await run_debugfs(image, [command])
        for ino, paths in parse_ncheck(out, set(chunk)).items():
            found.setdefault(ino, []).extend(paths)
    return found


async def read_inode(image: Path, ino: int, max_bytes: int) -> bytes:
    """The content of a regular file (or a slow symlink's target), at most ``max_bytes``
    (GuestError past it). One debugfs per file: content is never parsed."""
    out = await run_debugfs(image, [f"cat <{ino}>"], max_output=max_bytes + 4096)
    marker = f"debugfs: cat <{ino}>\n".encode()
    at = out.find(marker)
    if at < 0:
        raise GuestError(f"debugfs did not read inode {ino}")
    data = out[at + len(marker):]
    if len(data) > max_bytes:
        raise GuestError(f"a changed file is larger than {max_bytes} bytes")
    return data


_FAST_LINK = re.compile(rb'^Fast link dest: "(.*)"$', re.M | re.S)


async def link_target(image: Path, ino: int, size: int) -> str | None:
    """A symlink's target (None when it is not printable text)."""
    if size <= 0 or size > 4095:
        return None
    out = await run_debugfs(image, [f"stat <{ino}>"], max_output=64 << 10)
    m = _FAST_LINK.search(out)
    raw = m.group(1)[:size] if m is not None else await read_inode(image, ino, size)
    try:
        text = raw[:size].decode()
    except UnicodeDecodeError:
        return None
    return text if text.isprintable() else None
