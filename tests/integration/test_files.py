"""Files in a real sandbox: the agent's file actions through the runtime, and a
big file's round trip (32 MiB; 100 MiB in make stress) through a real daemon (PUT/GET
and ``forkd cp``) whose RSS must not grow by the file's size.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from forkd.controller.runtime import Runtime
from forkd.errors import Conflict, InvalidRequest, NotFound, TooLarge

from .conftest import Loop, soak
from .daemon_fixture import FORKD, SHARED_MAX_FILE_BYTES, Daemon, SharedDaemons

pytestmark = pytest.mark.vm

MIB = 1 << 20


@pytest.fixture(scope="module")
def sandbox(loop: Loop, runtime: Runtime, snapshot: str) -> Iterator[str]:
    [record] = loop.run(runtime.spawn(snapshot, 1))
    yield record.id
    loop.run(runtime.kill(record.id))


async def pieces(data: bytes, size: int = 300_000) -> AsyncIterator[bytes]:
    """Uneven pieces, as an HTTP body arrives."""
    for i in range(0, len(data), size):
        yield data[i:i + size]


async def read_all(runtime: Runtime, sandbox_id: str, path: str) -> bytes:
    _, stream = await runtime.files.open_read(sandbox_id, path)
    return b"".join([chunk async for chunk in stream])


def test_write_read_stat_list_mkdir_remove(loop: Loop, runtime: Runtime, sandbox: str) -> None:
    data = os.urandom(3 * MIB + 12345)  # several pieces, the last one short
    made = loop.run(runtime.files.mkdir(sandbox, "/tmp/ft/a/b", parents=True))
    assert made["created"] is True
    info = loop.run(runtime.files.write(sandbox, "/tmp/ft/a/b/data.bin", pieces(data), max_bytes=64 * MIB))
    assert info["type"] == "file" and info["size"] == len(data) and info["mode"] == 0o644
    assert loop.run(read_all(runtime, sandbox, "/tmp/ft/a/b/data.bin")) == data
    # The guest sees the same bytes.
    out = loop.run(runtime.exec(sandbox, ["sha256sum", "/tmp/ft/a/b/data.bin"]))
    assert out["stdout"].split()[0] == hashlib.sha256(data).hexdigest()
    listing = loop.run(runtime.files.list(sandbox, "/tmp/ft/a/b"))
    entries = [(e["name"], e["type"], e["size"]) for e in listing["entries"]]
    assert entries == [("data.bin", "file", len(data))]
    assert loop.run(runtime.files.stat(sandbox, "/tmp/ft/a"))["type"] == "dir"
    # Overwrite: replaced atomically; no temp file left beside it.
    loop.run(runtime.files.write(sandbox, "/tmp/ft/a/b/data.bin", pieces(b"short"), max_bytes=64))
    assert loop.run(read_all(runtime, sandbox, "/tmp/ft/a/b/data.bin")) == b"short"
    listed = loop.run(runtime.files.list(sandbox, "/tmp/ft/a/b"))
    assert [e["name"] for e in listed["entries"]] == ["data.bin"]
    # An empty file.
    loop.run(runtime.files.write(sandbox, "/tmp/ft/empty", pieces(b""), max_bytes=64))
    assert loop.run(read_all(runtime, sandbox, "/tmp/ft/empty")) == b""

    with pytest.raises(Conflict, match="not empty"):
        loop.run(runtime.files.remove(sandbox, "/tmp/ft/a"))
    loop.run(runtime.files.remove(sandbox, "/tmp/ft/a", recursive=True))
    with pytest.raises(NotFound):
        loop.run(runtime.files.stat(sandbox, "/tmp/ft/a"))


def test_each_bad_case_has_its_error(loop: Loop, runtime: Runtime, sandbox: str) -> None:
    with pytest.raises(NotFound):
        loop.run(runtime.files.open_read(sandbox, "/no/such/file"))
    with pytest.raises(NotFound):
        loop.run(runtime.files.write(sandbox, "/no/such/dir/file", pieces(b"x"), max_bytes=10))
    with pytest.raises(Conflict):
        loop.run(runtime.files.open_read(sandbox, "/tmp"))
    with pytest.raises(Conflict):
        loop.run(runtime.files.write(sandbox, "/tmp", pieces(b"x"), max_bytes=10))
    with pytest.raises(Conflict):
        loop.run(runtime.files.list(sandbox, "/etc/hostname"))
    with pytest.raises(InvalidRequest):
        loop.run(runtime.files.stat(sandbox, "relative/path"))
    with pytest.raises(InvalidRequest):
        loop.run(runtime.files.stat(sandbox, "/tmp/a\0b"))
    # Too large: refused midway, and the half-written temp file is gone.
    with pytest.raises(TooLarge):
        loop.run(runtime.files.write(sandbox, "/tmp/too-big", pieces(os.urandom(3 * MIB)), max_bytes=2 * MIB))

    async def settle() -> list[str]:
        await asyncio.sleep(0.5)  # the abort runs in the background
        return [e["name"] for e in (await runtime.files.list(sandbox, "/tmp"))["entries"]]

    names = loop.run(settle())
    assert "too-big" not in names and not [n for n in names if n.startswith(".forkd-upload-")]


def test_exec_is_not_stalled_by_a_transfer(loop: Loop, runtime: Runtime, sandbox: str) -> None:
    data = os.urandom(24 * MIB)

    async def both() -> tuple[float, float]:
        loop_time = asyncio.get_running_loop().time
        started = loop_time()
        upload = asyncio.create_task(runtime.files.write(sandbox, "/tmp/big", pieces(data, MIB),
                                                        max_bytes=64 * MIB))
        await asyncio.sleep(0.05)
        reply = await runtime.exec(sandbox, ["echo", "hi"])
        exec_done = loop_time() - started
        assert reply["stdout"] == "hi\n"
        await upload
        return exec_done, loop_time() - started

    exec_done, upload_done = loop.run(both())
    print(f"\nexec answered after {exec_done:.2f}s; the 24 MiB upload took {upload_done:.2f}s")
    assert exec_done < upload_done, "exec waited for the whole transfer"


# ------------------------------------------------------------- daemon level


def memory_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields


@pytest.fixture(scope="module")
def daemon(shared_daemons: SharedDaemons) -> Iterator[Daemon]:
    """The session's shared daemon, started with --max-file-bytes SHARED_MAX_FILE_BYTES (200 MiB)."""
    with shared_daemons.lend() as d:
        yield d


ROUND_TRIP_MIB = soak(32, 100)


@pytest.mark.soak
def test_a_big_file_round_trips_through_the_daemon_in_bounded_memory(
        daemon: Daemon, shared_daemons: SharedDaemons, tmp_path: Path) -> None:
    """ROUND_TRIP_MIB (32 in make test, 100 in make stress) up and down, four ways, in bounded memory."""
    src = tmp_path / "random.bin"
    digest = hashlib.sha256()
    with src.open("wb") as f:
        for _ in range(ROUND_TRIP_MIB):
            block = os.urandom(MIB)
            digest.update(block)
            f.write(block)
    want = digest.hexdigest()
    py = shared_daemons.template(daemon, "py", boot_wait_secs=180)["tag"]

    def sha256_of(path: Path) -> str:
        h = hashlib.sha256()
        with path.open("rb") as f:
            while block := f.read(MIB):
                h.update(block)
        return h.hexdigest()

    with daemon.client(timeout=600) as http:
        r = http.post("/v1/sandboxes", json={"snapshot_tag": py})
        assert r.status_code == 201, r.text
        sb = r.json()[0]["id"]
        assert daemon.proc is not None
        pid = daemon.proc.pid
        before = memory_kib(pid)
        with contextlib.suppress(OSError):  # resets VmHWM to the current RSS (Linux >= 4.0)
            Path(f"/proc/{pid}/clear_refs").write_text("5")

        # PUT streamed from the file (chunked, no Content-Length), GET streamed to disk.
        def body() -> Iterator[bytes]:
            with src.open("rb") as f:
                while block := f.read(256 * 1024):
                    yield block

        r = http.put(f"/v1/sandboxes/{sb}/files", params={"path": "/tmp/put.bin"}, content=body())
        assert r.status_code == 200, r.text
        assert r.json()["size"] == ROUND_TRIP_MIB * MIB
        got = tmp_path / "get.bin"
        with http.stream("GET", f"/v1/sandboxes/{sb}/files", params={"path": "/tmp/put.bin"}) as resp:
            assert resp.status_code == 200
            with got.open("wb") as f:
                for chunk in resp.iter_bytes():
                    f.write(chunk)
        assert sha256_of(got) == want

        # forkd cp, both directions.
        env = {**os.environ, "FORKD_URL": daemon.url, "FORKD_TOKEN": daemon.token}
        env.pop("FORKD_TOKEN_FILE", None)
        subprocess.run([str(FORKD), "cp", str(src), f"{sb}:/tmp/"], env=env, check=True, timeout=300)
        back = tmp_path / "back.bin"
        subprocess.run([str(FORKD), "cp", f"{sb}:/tmp/random.bin", str(back)], env=env, check=True,
                       timeout=300)
        assert sha256_of(back) == want
        out = http.post(f"/v1/sandboxes/{sb}/exec", json={"args": ["sha256sum", "/tmp/random.bin"]}).json()
        assert out["stdout"].split()[0] == want

        after = memory_kib(pid)
        grown_mib = (after["VmHWM"] - before["VmRSS"]) / 1024
        print(f"\ndaemon RSS {before['VmRSS'] // 1024} MiB before, peak {after['VmHWM'] // 1024} MiB "
              f"during 4 x {ROUND_TRIP_MIB} MiB transfers (+{grown_mib:.1f} MiB)")
        assert grown_mib < 50, f"the daemon's peak RSS grew by {grown_mib:.1f} MiB"

        # 413 past --max-file-bytes, from the Content-Length alone (raw HTTP: clients
        # will not declare a length they do not send).
        with socket.create_connection(("127.0.0.1", daemon.port), timeout=30) as conn:
            head = (f"PUT /v1/sandboxes/{sb}/files?path=/tmp/huge HTTP/1.1\r\nHost: x\r\n"
                    f"Authorization: Bearer {daemon.token}\r\n"
                    f"Content-Length: {SHARED_MAX_FILE_BYTES + 1}\r\n\r\n")
            conn.sendall(head.encode())
            answer = ""
            while '"error"' not in answer and (more := conn.recv(65536)):
                answer += more.decode(errors="replace")
        assert answer.startswith("HTTP/1.1 413") and '"error"' in answer, answer
        http.delete(f"/v1/sandboxes/{sb}")
