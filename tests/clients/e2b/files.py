"""An E2B user's file handling, unchanged: write, read, list, exists, rename, remove; binary data."""

import os

from e2b import Sandbox

payload = bytes(range(256)) * 64 + os.urandom(4096)  # every byte value, and then some

with Sandbox.create() as sbx:
    info = sbx.files.write("/tmp/data/blob.bin", payload)
    assert info.path == "/tmp/data/blob.bin", info

    assert bytes(sbx.files.read("/tmp/data/blob.bin", format="bytes")) == payload
    sbx.files.write("/tmp/data/note.txt", "héllo wörld\n")
    assert sbx.files.read("/tmp/data/note.txt") == "héllo wörld\n"

    names = sorted(entry.name for entry in sbx.files.list("/tmp/data"))
    assert names == ["blob.bin", "note.txt"], names
    sizes = {entry.name: entry.size for entry in sbx.files.list("/tmp/data")}
    assert sizes["blob.bin"] == len(payload), sizes

    assert sbx.files.exists("/tmp/data/blob.bin")
    assert not sbx.files.exists("/tmp/data/missing.bin")

    assert sbx.files.make_dir("/tmp/data/sub/dir")
    assert not sbx.files.make_dir("/tmp/data/sub/dir")  # already there
    moved = sbx.files.rename("/tmp/data/note.txt", "/tmp/data/sub/note.txt")
    assert moved.path == "/tmp/data/sub/note.txt"
    assert sbx.files.get_info("/tmp/data/sub").type.value == "dir"

    sbx.files.write_files([{"path": "/tmp/multi/a.bin", "data": b"\x00a"},
                           {"path": "/tmp/multi/b.bin", "data": b"\xffb"}])
    assert bytes(sbx.files.read("/tmp/multi/b.bin", format="bytes")) == b"\xffb"

    sbx.files.remove("/tmp/data/blob.bin")
    assert not sbx.files.exists("/tmp/data/blob.bin")
    sbx.files.remove("/tmp/data")
    assert not sbx.files.exists("/tmp/data/sub/note.txt")
    print("files ok")
