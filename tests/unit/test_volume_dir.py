"""vmm/volume_dir.py (with volume_ops, volume_tree, volume_files, beneath): a shared volume's files
on the host, from the ops of hostile guests.

Real files under tmp_path, no fakes. The confinement tests plant what a guest (or a racing second
guest) can plant, a symlink to a directory outside the volume or to '..', and check that a canary
file outside is neither read nor written, nor anything made beside it."""

from __future__ import annotations

import base64
import ctypes
import errno
import io
import os
import stat
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from forkd.errors import Conflict, InsufficientStorage, InvalidRequest, NotFound, PrerequisiteMissing
from forkd.guest.volume_messages import MAX_IO, MUTATING, OPS, READDIR_PAGE, VolOp, VolReplyNotice
from forkd.vmm import beneath
from forkd.vmm.volume_files import HostFiles as HostDir  # the files and the daemon's calls on them

MIB = 1 << 20
CANARY = b"outside the volume\n"


def _op(op: str, path: str = "", **fields: Any) -> VolOp:
    return VolOp(**{"seq": 7, "op": op, "path": path, "uid": 1000, "gid": 1000, **fields})  # type: ignore[typeddict-item]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture
def vol(tmp_path: Path) -> Iterator[HostDir]:
    root = tmp_path / "vol"
    root.mkdir()
    d = HostDir(root, 4 * MIB)
    yield d
    d.close()


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    out = tmp_path / "outside"
    out.mkdir()
    (out / "canary").write_bytes(CANARY)
    return out


def ok(d: HostDir, op: VolOp, *, read_only: bool = False) -> VolReplyNotice:
    reply = d.apply(op, 3, read_only=read_only)
    assert reply["errno"] == 0, (op, os.strerror(reply["errno"]))
    assert (reply["slot"], reply["seq"]) == (3, 7)
    return reply


def err(d: HostDir, op: VolOp, *, read_only: bool = False) -> int:
    reply = d.apply(op, 3, read_only=read_only)
    assert set(reply) == {"slot", "seq", "errno"}, reply
    return reply["errno"]


def _tree(root: Path) -> dict[str, tuple[int, int, bytes | str | None]]:
    out: dict[str, tuple[int, int, bytes | str | None]] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            st = p.lstat()
            body: bytes | str | None = None
            if stat.S_ISLNK(st.st_mode):
                body = os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                body = p.read_bytes()
            out[str(p.relative_to(root))] = (st.st_mode, st.st_uid, body)
    return out


def test_every_op_round_trips(vol: HostDir) -> None:
    root = vol.root
    attr = ok(vol, _op("mkdir", "d", mode=0o6775, uid=1001, gid=1002))["attr"]
    assert stat.S_ISDIR(attr["mode"]) and stat.S_IMODE(attr["mode"]) == 0o775  # never set-id
    st = (root / "d").stat()
    assert (attr["uid"], attr["gid"]) == (1001, 1002) == (st.st_uid, st.st_gid)
    attr = ok(vol, _op("create", "d/f", mode=0o4640, exclusive=True))["attr"]
    assert stat.S_ISREG(attr["mode"]) and stat.S_IMODE(attr["mode"]) == 0o640 and attr["size"] == 0
    assert err(vol, _op("create", "d/f", mode=0o644, exclusive=True)) == errno.EEXIST
    assert ok(vol, _op("create", "d/f", mode=0o600, exclusive=False))["attr"]["mode"] & 0o777 == 0o640
    assert ok(vol, _op("write", "d/f", offset=0, data=_b64(b"hello world")))["written"] == 11
    assert ok(vol, _op("write", "d/f", offset=6, data=_b64(b"there")))["written"] == 5
    assert ok(vol, _op("write", "d/f", offset=0, data=_b64(b"!\n"), append=True))["written"] == 2
    assert (root / "d/f").read_bytes() == b"hello there!\n"
    assert base64.b64decode(ok(vol, _op("read", "d/f", offset=6, size=100))["data"]) == b"there!\n"
    assert ok(vol, _op("read", "d/f", offset=1000, size=10))["data"] == ""
    assert ok(vol, _op("getattr", "d/f"))["attr"]["size"] == 13
    assert stat.S_ISDIR(ok(vol, _op("getattr", ""))["attr"]["mode"])
    assert ok(vol, _op("setattr", "", mode=0o775, mtime_ns=10**18))["attr"]["mtime_ns"] == 10**18  # the root
    assert stat.S_IMODE(root.stat().st_mode) == 0o775
    attr = ok(vol, _op("setattr", "d/f", mode=0o2600, owner_uid=5, owner_gid=6, size=5, atime_ns=10**18,
                       mtime_ns=2 * 10**18))["attr"]
    assert (stat.S_IMODE(attr["mode"]), attr["uid"], attr["gid"], attr["size"]) == (0o600, 5, 6, 5)
    assert (attr["atime_ns"], attr["mtime_ns"]) == (10**18, 2 * 10**18)
    before = time.time_ns()
    attr = ok(vol, _op("setattr", "d/f", mtime_ns=-1))["attr"]  # -1: now; atime kept
    assert before <= attr["mtime_ns"] <= time.time_ns() and attr["atime_ns"] == 10**18
    assert (root / "d/f").read_bytes() == b"hello"
    attr = ok(vol, _op("symlink", "d/l", target="../../../etc/passwd"))["attr"]
    assert stat.S_ISLNK(attr["mode"]) and attr["uid"] == 1000
    assert os.readlink(root / "d/l") == "../../../etc/passwd"
    assert ok(vol, _op("readlink", "d/l"))["target"] == "../../../etc/passwd"
    assert ok(vol, _op("setattr", "d/l", mode=0o777, owner_uid=7))["attr"]["uid"] == 7  # no chmod of a link
    assert ok(vol, _op("link", "d/f", to="g"))["attr"]["nlink"] == 2
    ok(vol, _op("rename", "g", to="d/g2", flags=0))
    assert err(vol, _op("rename", "d/g2", to="d/f", flags=1)) == errno.EEXIST
    assert err(vol, _op("rename", "d/g2", to="d/h", flags=2)) == errno.EINVAL
    ok(vol, _op("rename", "d/g2", to="d/h", flags=1))
    assert sorted(p.name for p in (root / "d").iterdir()) == ["f", "h", "l"]
    page = ok(vol, _op("readdir", "d", offset=0))
    assert [(e["name"], stat.S_IFMT(e["mode"])) for e in page["entries"]] == [
        ("f", stat.S_IFREG), ("h", stat.S_IFREG), ("l", stat.S_IFLNK)]
    assert page["more"] is False
    ok(vol, _op("fsync", "d/f"))
    ok(vol, _op("fsync", "d"))
    sf = ok(vol, _op("statfs"))["statfs"]
    assert (sf["bsize"], sf["blocks"], sf["files"]) == (4096, 1024, 1024)
    assert sf["ffree"] == 1024 - vol.usage()[1] and sf["bfree"] == (4 * MIB - vol.usage()[0]) // 4096
    assert err(vol, _op("rmdir", "d")) == errno.ENOTEMPTY
    for name in ("d/f", "d/h", "d/l"):
        ok(vol, _op("unlink", name))
    assert err(vol, _op("unlink", "d")) in (errno.EISDIR, errno.EPERM)
    ok(vol, _op("rmdir", "d"))
    assert list(root.iterdir()) == [] and vol.usage()[1] == 0
    assert err(vol, _op("getattr", "d")) == errno.ENOENT


def test_a_symlink_out_is_never_followed(vol: HostDir, outside: Path) -> None:
    """What a racing guest plants (a symlink to a directory outside, or to '..') used as a
    component, or as the last name, gives an errno; nothing outside is read, written or made."""
    root = vol.root
    os.symlink(outside, root / "etc")
    os.symlink("..", root / "up")
    os.symlink(outside / "canary", root / "file")
    before = _tree(outside.parent)
    for link in ("etc", "up", "up/outside"):
        name = f"{link}/canary"
        assert err(vol, _op("getattr", name)) == errno.ELOOP
        assert err(vol, _op("read", name, offset=0, size=100)) == errno.ELOOP
        assert err(vol, _op("write", name, offset=0, data=_b64(b"pwned"))) == errno.ELOOP
        assert err(vol, _op("write", name, data=_b64(b"pwned"), append=True)) == errno.ELOOP
        assert err(vol, _op("create", f"{link}/new", mode=0o644, exclusive=False)) == errno.ELOOP
        assert err(vol, _op("mkdir", f"{link}/newdir", mode=0o755)) == errno.ELOOP
        assert err(vol, _op("symlink", f"{link}/newlink", target="x")) == errno.ELOOP
        assert err(vol, _op("unlink", name)) == errno.ELOOP
        assert err(vol, _op("setattr", name, mode=0o777, size=0)) == errno.ELOOP
        assert err(vol, _op("rename", "file", to=f"{link}/moved")) == errno.ELOOP
        assert err(vol, _op("link", name, to="stolen")) == errno.ELOOP
        assert err(vol, _op("readdir", link, offset=0)) in (errno.ELOOP, errno.ENOTDIR)
        assert err(vol, _op("fsync", name)) == errno.ELOOP
        assert err(vol, _op("readlink", name)) == errno.ELOOP
    # The link as the last name: opened never, its own attributes only.
    assert err(vol, _op("read", "file", offset=0, size=100)) == errno.ELOOP
    assert err(vol, _op("write", "file", offset=0, data=_b64(b"pwned"))) == errno.ELOOP
    assert err(vol, _op("create", "file", mode=0o644, exclusive=False)) == errno.ELOOP
    assert err(vol, _op("setattr", "file", size=0)) == errno.ELOOP
    assert err(vol, _op("fsync", "file")) == errno.ELOOP
    assert stat.S_ISLNK(ok(vol, _op("getattr", "file"))["attr"]["mode"])
    ok(vol, _op("setattr", "file", mode=0o777))  # a link has no mode to set: the target's is not changed
    ok(vol, _op("setattr", "file", mtime_ns=5))  # the link's own time
    assert (vol.root / "file").lstat().st_mtime_ns == 5
    assert _tree(outside.parent) == before
    assert (outside / "canary").read_bytes() == CANARY
    assert stat.S_IMODE((outside / "canary").stat().st_mode) == 0o644
    # The Python API is confined the same way.
    with pytest.raises(InvalidRequest):
        vol.write_file("etc/canary", [b"pwned"])
    with pytest.raises(InvalidRequest):
        list(vol.read_file("file"))
    with pytest.raises(InvalidRequest):
        vol.listdir("up")
    vol.remove("up")  # the link itself goes; '..' is left alone
    assert _tree(outside.parent) == {k: v for k, v in before.items() if k != "vol/up"}


def test_a_racing_swap_never_leads_out(tmp_path: Path, outside: Path) -> None:
    """Another guest swaps a directory for a symlink to outside, over and over (renameat2's
    RENAME_EXCHANGE, atomic), while ops walk through it: each lands inside or fails; the canary
    outside is never read, written, truncated or joined by a new file."""
    libc = ctypes.CDLL(None, use_errno=True)
    (tmp_path / "vol").mkdir()
    vol = HostDir(tmp_path / "vol", 64 * MIB, max_entries=10_000)
    (vol.root / "d").mkdir()
    (vol.root / "d/canary").write_bytes(b"inside\n")
    os.symlink(outside, vol.root / "e")
    before = _tree(outside)
    stop = threading.Event()

    def swapper() -> None:
        d, e = str(vol.root / "d").encode(), str(vol.root / "e").encode()
        while not stop.is_set():
            assert libc.renameat2(-100, d, -100, e, 2) == 0, os.strerror(ctypes.get_errno())

    thread = threading.Thread(target=swapper)
    thread.start()
    landed = 0
    try:
        for i in range(1500):
            for op in (_op("write", "d/canary", offset=0, data=_b64(b"pwned!!\n")),
                       _op("setattr", "d/canary", size=0, mode=0o777),
                       _op("create", f"d/new{i}", mode=0o644), _op("mkdir", f"d/dir{i}", mode=0o755),
                       _op("read", "d/canary", offset=0, size=100)):
                reply = vol.apply(op, 1, read_only=False)
                assert reply["errno"] in (0, errno.ELOOP, errno.ENOTDIR, errno.ENOENT), (op, reply)
                if reply["errno"] == 0 and op["op"] == "read":
                    assert base64.b64decode(reply["data"]) in (b"", b"inside\n", b"pwned!!\n")
                landed += reply["errno"] == 0
    finally:
        stop.set()
        thread.join()
    vol.close()
    assert landed > 0 and _tree(outside) == before and (outside / "canary").read_bytes() == CANARY


def test_bad_paths_are_einval(vol: HostDir) -> None:
    (vol.root / "a").mkdir()
    for path in ("../x", "a/../../x", "a/./b", "a//b", "/etc/passwd", "a/", "a\0b", "x" * 256,
                 "/".join(["a"] * 2100)):
        assert err(vol, _op("getattr", path)) == errno.EINVAL, path
        assert err(vol, _op("create", path, mode=0o644)) == errno.EINVAL, path
    assert err(vol, _op("rename", "a", to="../b")) == errno.EINVAL
    assert err(vol, _op("link", "a", to="x\0")) == errno.EINVAL
    assert err(vol, _op("getattr", 5)) == errno.EINVAL  # type: ignore[arg-type]
    for op in ("unlink", "rmdir", "mkdir", "symlink", "readlink"):
        assert err(vol, _op(op, "", mode=0o755, target="x")) == errno.EINVAL, op  # never the root itself
    with pytest.raises(InvalidRequest):
        vol.stat("a/../..")
    assert sorted(p.name for p in vol.root.iterdir()) == ["a"]


def test_malformed_ops_are_errnos_not_exceptions(vol: HostDir) -> None:
    (vol.root / "f").write_bytes(b"x" * 100)
    cases: list[tuple[VolOp, int]] = [
        (_op("read", "f", offset=-1, size=10), errno.EINVAL),
        (_op("read", "f", offset=0, size=MAX_IO + 1), errno.EINVAL),
        (_op("read", "f", offset=0, size=-5), errno.EINVAL),
        (_op("read", "f", offset=1 << 70, size=5), errno.EINVAL),
        (_op("read", "f", size=5), errno.EINVAL),  # no offset
        (_op("write", "f", offset=-1, data=_b64(b"x")), errno.EINVAL),
        (_op("write", "f", offset=0, data="not base64!"), errno.EINVAL),
        (_op("write", "f", offset=0, data=_b64(b"x" * (MAX_IO + 1))), errno.EINVAL),
        (_op("write", "f", offset=0, data="A" * (10 * MAX_IO)), errno.EINVAL),
        (_op("write", "f", offset=0), errno.EINVAL),  # no data
        (_op("readdir", "", offset=-1), errno.EINVAL),
        (_op("mkdir", "d", mode=0o755, uid=-1), errno.EINVAL),
        (_op("mkdir", "d", mode=1 << 40), errno.EINVAL),
        (_op("setattr", "f", size=-1), errno.EINVAL),
        (_op("setattr", "f", owner_uid=1 << 33), errno.EINVAL),
        (_op("setattr", "f", mtime_ns=1 << 64), errno.EINVAL),
        (_op("symlink", "s", target=""), errno.EINVAL),
        (_op("symlink", "s", target="a\0b"), errno.EINVAL),
        (_op("rename", "f"), errno.EINVAL),  # no "to"
        (_op("chmod", "f", mode=0o777), errno.ENOSYS),
        (_op("__init__", "f"), errno.ENOSYS),
    ]
    for op, expected in cases:
        assert err(vol, op) == expected, op
    assert (vol.root / "f").read_bytes() == b"x" * 100 and sorted(os.listdir(vol.root)) == ["f"]


def test_a_special_file_is_never_opened(vol: HostDir) -> None:
    os.mkfifo(vol.root / "fifo")  # only the host's admin can make one: no op makes one
    assert stat.S_ISFIFO(ok(vol, _op("getattr", "fifo"))["attr"]["mode"])
    assert err(vol, _op("read", "fifo", offset=0, size=10)) == errno.EPERM
    assert err(vol, _op("write", "fifo", offset=0, data=_b64(b"x"))) in (errno.EPERM, errno.ENXIO)
    assert err(vol, _op("link", "fifo", to="l")) == errno.EPERM


def test_a_write_past_the_quota_is_enospc(tmp_path: Path) -> None:
    root = tmp_path / "vol"
    root.mkdir()
    d = HostDir(root, 256 << 10)
    ok(d, _op("create", "f", mode=0o644))
    chunk = _b64(b"y" * (64 << 10))
    for i in range(3):
        ok(d, _op("write", "f", offset=i * (64 << 10), data=chunk))
    used = d.usage()
    assert used[0] >= 192 << 10
    assert err(d, _op("write", "f", offset=192 << 10, data=chunk)) == errno.ENOSPC
    assert err(d, _op("write", "f", data=chunk, append=True)) == errno.ENOSPC
    assert d.usage() == used and (root / "f").stat().st_size == 192 << 10
    # Overwriting bytes the file already holds allocates nothing: allowed at the quota.
    ok(d, _op("write", "f", offset=0, data=chunk))
    # Growth by truncate is checked too; no file grows past the quota at all.
    assert err(d, _op("setattr", "f", size=256 << 10)) == errno.ENOSPC  # the root's block is counted too
    assert err(d, _op("setattr", "f", size=1 << 30)) == errno.EFBIG
    assert err(d, _op("write", "f", offset=1 << 30, data=_b64(b"z"))) == errno.EFBIG
    assert (root / "f").stat().st_size == 192 << 10 and d.usage() == used
    with pytest.raises(InsufficientStorage):
        d.write_file("g", iter([b"z" * (64 << 10)] * 4))
    assert sorted(os.listdir(root)) == ["f"] and d.usage() == used  # the upload's temp is gone
    ok(d, _op("unlink", "f"))
    assert d.usage() == (root.stat().st_blocks * 512, 0)  # the root directory's own block
    d.close()


def test_the_file_count_is_bounded(tmp_path: Path) -> None:
    root = tmp_path / "vol"
    root.mkdir()
    d = HostDir(root, 4 * MIB, max_entries=3)
    ok(d, _op("create", "a", mode=0o644))
    ok(d, _op("symlink", "b", target="a"))
    ok(d, _op("link", "a", to="c"))
    assert err(d, _op("create", "d", mode=0o644)) == errno.ENOSPC
    assert err(d, _op("mkdir", "d", mode=0o755)) == errno.ENOSPC
    # What exists is still what exists when full: opened by a create, EEXIST to a mkdir.
    assert ok(d, _op("create", "a", mode=0o644, exclusive=False))["attr"]["nlink"] == 2
    assert err(d, _op("create", "a", mode=0o644, exclusive=True)) == errno.EEXIST
    assert err(d, _op("mkdir", "a", mode=0o755)) == errno.EEXIST
    assert err(d, _op("symlink", "b", target="x")) == errno.EEXIST
    with pytest.raises(Conflict, match="not a directory"):
        d.mkdir("a", parents=True)
    assert sorted(os.listdir(root)) == ["a", "b", "c"]
    assert ok(d, _op("statfs"))["statfs"]["ffree"] == 0
    d.close()


def test_concurrent_appenders_lose_no_line(vol: HostDir) -> None:
    """Two sandboxes append to one file with stale offsets: every line lands, none torn. The second
    appender goes through its own HostDir (as a second daemon on the host would): the kernel's
    O_APPEND orders them, not a lock of ours."""
    ok(vol, _op("create", "log", mode=0o644))
    other = HostDir(vol.root, vol.quota)

    def appender(d: HostDir, tag: str) -> None:
        for i in range(2000):
            line = f"{tag}-{i:05d}-{'x' * (i % 37)}\n".encode()
            reply = d.apply(_op("write", "log", offset=0, data=_b64(line), append=True), 1, read_only=False)
            assert reply["errno"] == 0 and reply["written"] == len(line)

    threads = [threading.Thread(target=appender, args=args) for args in ((vol, "a"), (other, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = (vol.root / "log").read_bytes().decode().splitlines()
    expected = {f"{tag}-{i:05d}-{'x' * (i % 37)}" for tag in ("a", "b") for i in range(2000)}
    assert len(lines) == 4000 and set(lines) == expected
    other.close()


def test_read_only_refuses_every_mutating_op(vol: HostDir) -> None:
    root = vol.root
    (root / "d").mkdir()
    (root / "d/f").write_bytes(b"data")
    before = _tree(root)
    ops = {
        "mkdir": _op("mkdir", "d/new", mode=0o755), "create": _op("create", "d/g", mode=0o644),
        "unlink": _op("unlink", "d/f"), "rmdir": _op("rmdir", "d"), "rename": _op("rename", "d/f", to="x"),
        "setattr": _op("setattr", "d/f", size=0, mode=0o777), "write": _op("write", "d/f", offset=0,
                                                                             data=_b64(b"XXXX")),
        "symlink": _op("symlink", "d/l", target="f"), "link": _op("link", "d/f", to="d/l2"),
    }
    assert set(ops) == MUTATING
    for op in ops.values():
        assert err(vol, op, read_only=True) == errno.EROFS, op
    assert _tree(root) == before
    for name in sorted(set(OPS) - MUTATING):  # the others still answer
        op = _op(name, "d/f" if name != "readdir" else "d", offset=0, size=4)
        reply = vol.apply(op, 3, read_only=True)
        assert reply["errno"] in (0, errno.EINVAL), (name, reply)  # readlink of a file: EINVAL


def test_readdir_pages(vol: HostDir) -> None:
    ok(vol, _op("mkdir", "many", mode=0o755))
    names = sorted(f"n{i:04d}" for i in range(600))
    for name in reversed(names):
        (vol.root / "many" / name).touch()
    seen: list[str] = []
    offset = 0
    while True:
        reply = ok(vol, _op("readdir", "many", offset=offset))
        assert len(reply["entries"]) <= READDIR_PAGE
        seen += [e["name"] for e in reply["entries"]]
        offset += len(reply["entries"])
        if not reply["more"]:
            break
    assert seen == names and offset == 600
    assert ok(vol, _op("readdir", "many", offset=600))["entries"] == []


def test_usage_is_the_trees(tmp_path: Path) -> None:
    root = tmp_path / "vol"
    (root / "sub").mkdir(parents=True)
    (root / "sub/f").write_bytes(b"a" * 10000)
    os.link(root / "sub/f", root / "hard")
    os.symlink("sub", root / "l")
    d = HostDir(root, 4 * MIB)
    dirs_and_file = (root / "sub").stat().st_blocks * 512 + (root / "sub/f").stat().st_blocks * 512
    assert d.usage() == (dirs_and_file + root.stat().st_blocks * 512, 4)
    d.close()


def test_the_python_api(vol: HostDir, tmp_path: Path) -> None:
    vol.mkdir("/a/b/c", parents=True)
    vol.mkdir("a/b/c", parents=True)  # exists: fine
    with pytest.raises(Conflict):
        vol.mkdir("a")
    assert vol.stat("/a/b")["uid"] == 1000
    attr = vol.write_file("/a/b/c/file.txt", iter([b"one ", b"two"]), mode=0o4755)
    assert attr["size"] == 7 and stat.S_IMODE(attr["mode"]) == 0o755 and attr["uid"] == 1000
    assert b"".join(vol.read_file("a/b/c/file.txt")) == b"one two"
    vol.write_file("a/b/c/file.txt", [b"replaced"])
    assert (vol.root / "a/b/c/file.txt").read_bytes() == b"replaced"
    big = bytes(range(256)) * 2000
    vol.write_file("big", [big])
    chunks = list(vol.read_file("big"))
    assert b"".join(chunks) == big and max(map(len, chunks)) <= MAX_IO
    assert [e["name"] for e in vol.listdir("/")] == ["a", "big"]
    vol.rename("big", "a/big2")
    vol.chmod_chown("a/big2", mode=0o600, uid=4, gid=5)
    st = (vol.root / "a/big2").stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o600, 4, 5)
    with pytest.raises(NotFound):
        vol.stat("nope")
    with pytest.raises(NotFound):
        vol.read_file("nope")
    with pytest.raises(InvalidRequest):
        vol.read_file("a")
    with pytest.raises(Conflict):
        vol.remove("a")
    with pytest.raises(InvalidRequest):
        vol.remove("/")
    out = tmp_path / "export"
    os.symlink("/etc/passwd", vol.root / "a/link")
    vol.export_to(out)
    assert (out / "a/b/c/file.txt").read_bytes() == b"replaced"
    assert os.readlink(out / "a/link") == "/etc/passwd" and (out / "a/big2").stat().st_uid == 4
    with pytest.raises(FileExistsError):
        vol.export_to(out)
    vol.remove("a", recursive=True)
    assert list(vol.root.iterdir()) == [] and vol.usage()[1] == 0
    vol.scan()
    assert vol.usage()[1] == 0


def test_a_missing_root_is_a_forkd_error(tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        HostDir(tmp_path / "gone", MIB)


def test_a_kernel_without_openat2_is_refused_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(beneath, "SYS_OPENAT2", 99_999)  # a number no kernel has: ENOSYS, as before 5.6
    with pytest.raises(PrerequisiteMissing, match=r"Linux 5\.6"):
        HostDir(tmp_path, MIB)


def test_make_from_a_directory(tmp_path: Path, outside: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub/f").write_bytes(b"hello")
    os.chmod(src / "sub/f", 0o4755)
    os.symlink(outside, src / "out")  # copied as a link, never followed
    os.mkfifo(src / "fifo")  # not a file, directory or link: not copied
    root = tmp_path / "vols" / "v1"
    HostDir.make(root, src, 4 * MIB, tmp_path / "scratch")
    st = root.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1000, 1000, 0o755)
    assert (root / "sub/f").read_bytes() == b"hello"
    assert stat.S_IMODE((root / "sub/f").stat().st_mode) == 0o755
    assert os.readlink(root / "out") == str(outside) and not (root / "fifo").exists()
    assert {(p.lstat().st_uid, p.lstat().st_gid) for p in root.rglob("*")} == {(1000, 1000)}
    assert sorted(os.listdir(root.parent)) == ["v1"]
    with pytest.raises(Conflict):
        HostDir.make(root, None, 4 * MIB, tmp_path / "scratch")
    (src / "big").write_bytes(b"z" * (2 * MIB))
    with pytest.raises(InvalidRequest, match="more than fits"):
        HostDir.make(tmp_path / "vols" / "v2", src, MIB, tmp_path / "scratch")
    assert sorted(os.listdir(root.parent)) == ["v1"]
    (src / "big").unlink()
    inner = src / "vols" / "v4"  # made inside its own source: not copied into itself
    HostDir.make(inner, src, 4 * MIB, tmp_path / "scratch")
    assert sorted(os.listdir(inner)) == ["out", "sub", "vols"] and os.listdir(inner / "vols") == []
    empty = tmp_path / "vols" / "v3"
    HostDir.make(empty, None, MIB, tmp_path / "scratch")
    assert list(empty.iterdir()) == [] and empty.stat().st_uid == 1000


def _tarball(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))


def test_make_from_a_tarball(tmp_path: Path) -> None:
    good = tmp_path / "good.tar.gz"
    _tarball(good, {"dir/a.txt": b"A", "b.txt": b"B"})
    root = tmp_path / "vols" / "v"
    HostDir.make(root, good, 4 * MIB, tmp_path / "scratch")
    assert (root / "dir/a.txt").read_bytes() == b"A" and (root / "dir").stat().st_uid == 1000
    assert list((tmp_path / "scratch").iterdir()) == []
    bad = tmp_path / "bad.tar.gz"
    _tarball(bad, {"fine.txt": b"ok", "../x": b"escaped"})
    with pytest.raises(InvalidRequest, match="leave the volume"):
        HostDir.make(tmp_path / "vols" / "w", bad, 4 * MIB, tmp_path / "scratch")
    assert sorted(os.listdir(tmp_path / "vols")) == ["v"] and not (tmp_path / "x").exists()
    assert not (tmp_path / "vols" / "x").exists() and list((tmp_path / "scratch").iterdir()) == []
