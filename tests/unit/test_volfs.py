"""The guest's FUSE server of shared volumes (guest/agent/volfs.py), mounted on this host for real and
answered by the daemon's side (host/volume_dir.py HostDir), as a sandbox and its daemon would: the
host's polls and replies go through the same VolumeMounts calls the agent's serve loop makes. Only
the agent's channel to the host is stood in for (it is IO): a polled answer is handed back directly.

Two mounts of one volume stand in for two sandboxes. Needs /dev/fuse and root (mount(2))."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from forkd.guest.agent.channel import Channel
from forkd.guest.agent.volume_mounts import VolumeMounts
from forkd.vmm.volume_dir import HostDir

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/dev/fuse"),
                                reason="mounting FUSE needs root and /dev/fuse")

QUOTA = 4 << 20


class HeldAnswers(Channel):
    """The agent's channel, where only a held poll's late answer is caught (for the host thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: dict[Any, dict[str, Any]] = {}
        self.ready = threading.Condition()

    def reply(self, req_id: Any, result: Any) -> None:
        with self.ready:
            self.answers[req_id] = result
            self.ready.notify_all()

    def forget(self, req_id: Any) -> None:
        pass


class Guest:
    """One sandbox's agent with the volume mounted at ``mount``, and its daemon's poller."""

    def __init__(self, mount: Path, files: HostDir, read_only: bool = False) -> None:
        self.mount = mount
        self.channel = HeldAnswers()
        self.agent = VolumeMounts(self.channel)
        self.agent.mount({"slot": 0, "mount": str(mount), "read_only": read_only})
        self._stop = False
        self._files = files
        self._read_only = read_only
        self._thread = threading.Thread(target=self._host, daemon=True)
        self._thread.start()

    def _host(self) -> None:
        req_id = 0
        resend = True
        while not self._stop:
            req_id += 1
            got = self.agent.poll({"id": req_id, "slot": 0, "resend": resend, "wait_secs": 0.5})
            resend = False
            if got is None:
                with self.channel.ready:
                    self.channel.ready.wait_for(lambda asked=req_id: asked in self.channel.answers, timeout=5)
                    got = self.channel.answers.pop(req_id, {"ops": []})
            for op in got["ops"]:
                self.agent.reply(self._files.apply(op, 0, read_only=self._read_only))  # type: ignore[arg-type]

    def close(self) -> None:
        self._stop = True
        unmount(self.mount)
        self._thread.join(timeout=5)


def unmount(mount: Path) -> None:
    """Unmount, and end the connection: a thread of a failed test still waiting on it is let go. Its
    device comes from mountinfo: a stat of the mount would itself wait for an answer."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        if fields[4] == str(mount):
            minor = fields[2].split(":")[1]
            if not os.path.exists(f"/sys/fs/fuse/connections/{minor}"):
                subprocess.run(["mount", "-t", "fusectl", "none", "/sys/fs/fuse/connections"], check=False,
                               capture_output=True)
            with contextlib.suppress(OSError):
                Path(f"/sys/fs/fuse/connections/{minor}/abort").write_text("1")
    subprocess.run(["umount", "-l", str(mount)], check=False)


def sh(script: str, user: int | None = None) -> subprocess.CompletedProcess[str]:
    def demote() -> None:
        if user is not None:
            os.setgid(user)
            os.setuid(user)
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60, preexec_fn=demote)


@pytest.fixture
def volume(tmp_path: Path) -> HostDir:
    HostDir.make(tmp_path / "files", None, QUOTA, tmp_path)
    return HostDir(tmp_path / "files", QUOTA)


@pytest.fixture
def points() -> Iterator[Path]:
    """Mount points the guest's user (uid 1000) can reach: pytest's own tmp_path is root's alone."""
    where = Path(tempfile.mkdtemp(prefix="forkd-volfs-"))
    where.chmod(0o755)
    yield where
    shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def two(points: Path, volume: HostDir) -> Iterator[tuple[Guest, Guest]]:
    a = Guest(points / "a", volume)
    b = Guest(points / "b", volume)
    yield a, b
    a.close()
    b.close()


def test_files_made_in_one_are_seen_by_the_other_and_kept_on_the_host(two: tuple[Guest, Guest],
                                                                      tmp_path: Path) -> None:
    a, b = two
    assert not (b.mount / "x.txt").exists()  # looked up first: a name that is not there is not kept
    r = sh(f"cd {a.mount} && echo one > x.txt && mkdir -p d/e && echo two >> d/e/y && ln -s d/e/y link && "
           "mv x.txt z.txt && chmod 600 z.txt", user=1000)
    assert r.returncode == 0, r.stderr
    assert (b.mount / "z.txt").read_text() == "one\n" and not (b.mount / "x.txt").exists()
    assert (b.mount / "link").read_text() == "two\n" and os.readlink(b.mount / "link") == "d/e/y"
    assert oct((b.mount / "z.txt").stat().st_mode & 0o777) == "0o600"
    assert (b.mount / "z.txt").stat().st_uid == 1000  # the guest's user owns what it made
    host = tmp_path / "files"
    assert (host / "z.txt").read_text() == "one\n" and (host / "z.txt").stat().st_uid == 1000
    assert sorted(os.listdir(b.mount)) == ["d", "link", "z.txt"]
    r = sh(f"cd {b.mount} && rm -r d link && truncate -s 3 z.txt && cat z.txt", user=1000)
    assert (r.returncode, r.stdout) == (0, "one")
    assert sorted(os.listdir(a.mount)) == ["z.txt"]


def test_concurrent_appends_from_two_mounts_lose_no_line(two: tuple[Guest, Guest], tmp_path: Path) -> None:
    a, b = two
    n = 300

    def appends(guest: Guest, who: str) -> int:
        script = f'i=0; while [ $i -lt {n} ]; do echo "{who}-$i" >> {guest.mount}/log; i=$((i+1)); done'
        return sh(script).returncode

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        assert list(pool.map(lambda g: appends(*g), [(a, "a"), (b, "b")])) == [0, 0]
    lines = (tmp_path / "files" / "log").read_text().splitlines()
    assert sorted(lines) == sorted(f"{w}-{i}" for w in "ab" for i in range(n))


def test_the_quota_holds_and_big_files_round_trip(two: tuple[Guest, Guest], tmp_path: Path) -> None:
    a, b = two
    r = sh(f"dd if=/dev/urandom of={a.mount}/big bs=256K count=8 && cmp {a.mount}/big {b.mount}/big")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "files" / "big").stat().st_size == 2 << 20
    r = sh(f"dd if=/dev/zero of={a.mount}/more bs=1M count=8")
    assert r.returncode != 0 and "No space left" in r.stderr
    assert a.mount.joinpath("big").stat().st_size == 2 << 20
    df = sh(f"df -k {b.mount} | tail -1").stdout.split()
    assert int(df[1]) == QUOTA >> 10


def test_permissions_are_the_guest_kernels(two: tuple[Guest, Guest]) -> None:
    a, _b = two
    assert sh(f"echo secret > {a.mount}/root-only && chmod 600 {a.mount}/root-only").returncode == 0
    r = sh(f"cat {a.mount}/root-only", user=1000)
    assert r.returncode != 0 and "Permission denied" in r.stderr


def test_a_read_only_mount_refuses_writes(tmp_path: Path, points: Path, volume: HostDir) -> None:
    (tmp_path / "files" / "seed").write_text("seeded\n")
    reader = Guest(points / "ro", volume, read_only=True)
    try:
        assert (reader.mount / "seed").read_text() == "seeded\n"
        r = sh(f"echo no > {reader.mount}/new; rm {reader.mount}/seed")
        assert "Read-only file system" in r.stderr
        assert sorted(os.listdir(tmp_path / "files")) == ["seed"]
    finally:
        reader.close()


def test_a_mount_point_is_refused_twice_at_another_path(points: Path, volume: HostDir) -> None:
    guest = Guest(points / "m", volume)
    try:
        assert guest.agent.mount({"slot": 0, "mount": str(points / "m"), "read_only": False})["already"]
        with pytest.raises(Exception, match="is mounted at"):
            guest.agent.mount({"slot": 0, "mount": str(points / "other"), "read_only": False})
    finally:
        guest.close()


def test_ops_a_host_took_and_never_answered_go_to_the_next_host(tmp_path: Path, points: Path,
                                                                 volume: HostDir) -> None:
    """A restored child (or a re-adopting daemon) asks with resend: what the old host took comes again."""
    channel = HeldAnswers()
    agent = VolumeMounts(channel)
    mount = points / "m"
    agent.mount({"slot": 0, "mount": str(mount), "read_only": False})
    ids = iter(range(1, 10_000))

    def take(resend: bool) -> list[Any]:
        req_id = next(ids)
        got = agent.poll({"id": req_id, "slot": 0, "resend": resend, "wait_secs": 0.2})
        if got is None:
            with channel.ready:
                channel.ready.wait_for(lambda: req_id in channel.answers, timeout=5)
                got = channel.answers.pop(req_id, {"ops": []})
        return list(got["ops"])

    try:
        writer = threading.Thread(target=lambda: (mount / "f").write_text("late\n"))
        writer.start()
        taken: list[Any] = []
        while not taken:  # the first host takes the writer's first op and never answers it
            taken = take(False)
        ops = take(True)
        assert [op["seq"] for op in ops] == [op["seq"] for op in taken]
        while writer.is_alive():  # the new host answers everything from here on
            for op in ops:
                agent.reply(volume.apply(op, 0, read_only=False))  # type: ignore[arg-type]
            ops = take(False)
        assert (tmp_path / "files" / "f").read_text() == "late\n"
    finally:
        unmount(mount)
