"""An E2B user's file metadata (envd 0.6.2) and watch events with their entry (envd 0.6.3),
unchanged: write with metadata (multipart and octet-stream, one and several files), read it back
from get_info, list and rename, and lose it on an overwrite without; bad metadata is refused."""

import time

from e2b import FilesystemEventType, InvalidArgumentException, Sandbox
from e2b.sandbox.filesystem.filesystem import WriteEntry

with Sandbox.create() as sbx:
    meta = {"author": "mish", "purpose": "upload"}
    assert sbx.files.write("m/a.txt", "one", metadata=meta).metadata == meta
    assert sbx.files.get_info("m/a.txt").metadata == meta
    streamed = sbx.files.write("m/b.txt", "two", metadata={"Stage": "octet"}, use_octet_stream=True)
    assert streamed.metadata == {"stage": "octet"}, streamed  # keys are lowercased, as by envd
    batch = [WriteEntry(path="m/c1.txt", data="1"), WriteEntry(path="m/c2.txt", data="2")]
    many = sbx.files.write_files(batch, metadata={"source": "batch"})
    assert [w.metadata for w in many] == [{"source": "batch"}] * 2, many
    listed = {e.name: e.metadata for e in sbx.files.list("m")}
    assert listed == {"a.txt": meta, "b.txt": {"stage": "octet"}, "c1.txt": {"source": "batch"},
                      "c2.txt": {"source": "batch"}}, listed
    assert sbx.files.rename("m/a.txt", "m/renamed.txt").metadata == meta
    # Stored as user.e2b.* extended attributes: what another tool sets shows too.
    sbx.commands.run("python3 -c \"import os; os.setxattr('/home/user/m/b.txt', 'user.e2b.extra', b'x')\"")
    assert sbx.files.get_info("m/b.txt").metadata == {"stage": "octet", "extra": "x"}
    # An overwrite without metadata clears it.
    assert sbx.files.write("m/renamed.txt", "again").metadata is None
    assert sbx.files.get_info("m/renamed.txt").metadata is None
    # As root, and bad metadata refused before anything is written.
    assert sbx.files.write("/root/r.txt", "r", metadata={"k": "v"}, user="root").metadata == {"k": "v"}
    for bad in ({"bad key": "v"}, {"k": "bad\nvalue"}, {"k": "v" * 5000}):
        try:
            sbx.files.write("m/bad.txt", "x", metadata=bad)
            raise AssertionError(f"{bad} was accepted")
        except InvalidArgumentException:
            pass
    assert not sbx.files.exists("m/bad.txt")

    # Watch events with their entry; allow_network_mounts is accepted.
    handle = sbx.files.watch_dir("m", include_entry=True, allow_network_mounts=True)
    sbx.files.write("m/c1.txt", "changed", metadata={"v": "2"})
    deadline, entry = time.monotonic() + 60, None
    while entry is None and time.monotonic() < deadline:
        for event in handle.get_new_events():
            if event.name == "c1.txt" and event.type == FilesystemEventType.WRITE:
                entry = event.entry
        time.sleep(0.2)
    handle.stop()
    assert entry is not None and entry.path == "/home/user/m/c1.txt", entry
    assert entry.metadata == {"v": "2"}, entry
print("metadata ok")
