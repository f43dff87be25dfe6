"""The block -> inode -> path mapping of a diff (host/extfs.py, controller/diffs.compare), on real
ext4 images made here with mkfs.ext4 and changed with debugfs -w (no VM): the changed blocks are
found by comparing the two images, as a qcow2 overlay's allocated clusters would name them. And
the guest's disk as hostile input: crafted names, output that imitates debugfs, runaway output."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest

from forkd.controller import diff_render
from forkd.controller.diffs import check_filters, compare, matches
from forkd.errors import GuestError, InvalidRequest
from forkd.host import extfs

pytestmark = pytest.mark.skipif(shutil.which("mkfs.ext4") is None and not Path("/sbin/mkfs.ext4").exists(),
                                reason="needs e2fsprogs")

CLUSTER = 65536


def _mkfs(tmp: Path, tree: dict[str, str]) -> Path:
    root = tmp / "tree"
    for rel, text in tree.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    image = tmp / "base.ext4"
    subprocess.run(["mkfs.ext4", "-q", "-F", "-d", str(root), "-b", "4096", "-E", "lazy_itable_init=0",
                    str(image), "64M"], check=True, env={"PATH": "/usr/sbin:/sbin:/usr/bin:/bin"})
    return image


def _changed(tmp: Path, base: Path, commands: list[str]) -> Path:
    image = tmp / "new.ext4"
    shutil.copyfile(base, image)
    subprocess.run([extfs.debugfs_tool(), "-w", "-f", "-", str(image)], input="\n".join(commands).encode(),
                   check=True, capture_output=True)
    return image


def _ranges(a: Path, b: Path) -> list[tuple[int, int]]:
    """The clusters that differ, as an overlay would hold them."""
    out: list[tuple[int, int]] = []
    with open(a, "rb") as fa, open(b, "rb") as fb:
        offset = 0
        while True:
            x, y = fa.read(CLUSTER), fb.read(CLUSTER)
            if not x and not y:
                break
            if x != y:
                out.append((offset, CLUSTER))
            offset += CLUSTER
    return out


def _diff(old: Path, new: Path) -> dict[str, tuple[str, bool]]:
    changes, _ = asyncio.run(compare(old, new, _ranges(old, new)))
    return {c.path: (c.status, c.old is not None and c.new is not None and c.old.mode != c.new.mode)
            for c in changes}


def test_a_write_a_new_file_a_deletion_and_a_chmod_are_named_by_path(tmp_path: Path) -> None:
    base = _mkfs(tmp_path, {"work/a.py": "a\n", "work/b.py": "b\n", "work/sub/c.txt": "c\n",
                            **{f"work/many/f{i}": str(i) for i in range(40)}})
    (tmp_path / "payload").write_text("new content\n")
    new = _changed(tmp_path, base, [
        "rm /work/b.py",
        f"write {tmp_path / 'payload'} /work/new.py",
        "sif /work/sub/c.txt mode 0100600",
        "sif /work/a.py mtime 20300101000000",
        "sif /work/a.py size 1",
    ])
    changes = _diff(base, new)
    assert changes == {"/work/b.py": ("deleted", False), "/work/new.py": ("added", False),
                       "/work/sub/c.txt": ("modified", True), "/work/a.py": ("modified", False)}


def test_unchanged_images_have_no_changes(tmp_path: Path) -> None:
    base = _mkfs(tmp_path, {"x": "1"})
    assert _diff(base, base) == {}


def test_crafted_names_are_skipped_never_misread(tmp_path: Path) -> None:
    base = _mkfs(tmp_path, {"d/ok": "1"})
    # Names that imitate ncheck's lines (ino TAB path) and ls -p's, and one that is not UTF-8: a
    # whole other image, so every block differs and every inode is looked at.
    tree = tmp_path / "hostile"
    (tree / "d" / "evil\n12\t").mkdir(parents=True)
    (tree / "d" / "evil\n12\t" / "etc").write_text("x")
    (tree / "d" / "ok").write_text("2")
    (tree / "d").joinpath(b"\xff".decode("utf-8", "surrogateescape")).write_text("3")
    new = tmp_path / "hostile.ext4"
    subprocess.run(["mkfs.ext4", "-q", "-F", "-d", str(tree), "-b", "4096", str(new), "64M"], check=True,
                   env={"PATH": "/usr/sbin:/sbin:/usr/bin:/bin"})
    changes, skipped = asyncio.run(compare(base, new, [(0, new.stat().st_size)]))
    paths = {c.path for c in changes}
    assert "/d/ok" in paths
    assert all(p.isprintable() for p in paths)
    assert skipped >= 1  # the names that are not printable UTF-8


def test_inodes_in_ranges_maps_table_blocks_to_inode_numbers() -> None:
    geometry = extfs.Geometry(block_size=4096, inode_size=256, inodes_per_group=8192, inode_count=16384,
                              inode_tables=(100, 612))
    assert extfs.inodes_in_ranges(geometry, [(100 * 4096, 4096)]) == {2, *range(11, 17)}
    assert extfs.inodes_in_ranges(geometry, [(613 * 4096, 10)]) == set(range(8192 + 17, 8192 + 33))
    assert extfs.inodes_in_ranges(geometry, [(0, 100 * 4096)]) == set()  # no inode table there
    with pytest.raises(GuestError, match="too many"):
        extfs.inodes_in_ranges(geometry, [(100 * 4096, 1024 * 4096)], limit=100)


def test_parsers_refuse_what_is_not_debugfs_output() -> None:
    with pytest.raises(GuestError):
        extfs.parse_geometry(b"Block size: 4096\n")
    assert extfs.parse_stat(5, b"Inode: 6   Type: regular    Mode:  0644   Flags: 0x0\n") is None
    forged = b"/12/100644/0/0/a\n/13/100644/0/0/b/1/\n/14/100644/0/0/c/1/\n"
    assert [e.name for e in extfs.parse_ls(forged)] == ["b", "c"]
    assert extfs.parse_ncheck(b"Inode\tPathname\n12\t//a/../etc\n13\t/ok\n99\t/not-asked\n", {12, 13}) == {
        13: ["/ok"]}
    assert extfs.clean_path(b"/a/\xff") is None and extfs.clean_path(b"//a//b") == "/a/b"
    with pytest.raises(GuestError, match="lacks"):
        extfs.split_commands(b"debugfs: stat <1>\n", ["stat <1>", "stat <2>"])


def test_debugfs_output_and_time_are_bounded(tmp_path: Path) -> None:
    base = _mkfs(tmp_path, {f"f{i}": "x" for i in range(200)})
    with pytest.raises(GuestError, match="more than"):
        asyncio.run(extfs.run_debugfs(base, ["ls -l /"], max_output=1000))


def test_filters_take_prefixes_and_names() -> None:
    assert check_filters(["/work//x/", "__pycache__"], "exclude") == ["/work/x", "__pycache__"]
    with pytest.raises(InvalidRequest):
        check_filters(["/a/../b"], "include")
    assert matches("/work/x/y.py", ["/work/x"]) and not matches("/work/xy", ["/work/x"])
    assert matches("/a/__pycache__/m.pyc", ["__pycache__"]) and matches("/a/m.pyc", ["*.pyc"])


@pytest.mark.parametrize(("old", "new"), [
    (b"a\nb\nc\n", b"a\nB\nc\n"), (b"a\nb", b"a\nb\nc"), (None, b"new\n"), (b"gone\n", None),
])
def test_a_unified_diff_applies_with_patch(tmp_path: Path, old: bytes | None, new: bytes | None) -> None:
    target = tmp_path / "w" / "f.txt"
    target.parent.mkdir()
    if old is not None:
        target.write_bytes(old)
    patch = diff_render.unified("/w/f.txt", old, new)
    subprocess.run(["patch", "-p1", "-d", str(tmp_path)], input=patch.encode(), check=True,
                   capture_output=True)
    assert (target.read_bytes() if target.exists() else None) == new


def test_binary_files_are_flagged() -> None:
    assert diff_render.unified("/b", b"\x00\x01", b"\x00\x02").endswith("Binary files a/b and b/b differ\n")
