"""Run a real ``forkd daemon`` process for the daemon integration tests.

The daemon is started exactly as a user would (``forkd daemon --bind ...
--data-dir ... --token-file ...``) in its own process, with the shared guest
image (``FORKD_IMAGES_DIR``) and the cached accelerator probe copied into a
throwaway data dir, so only the template boot of the first snapshot costs VM
time.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from forkd.config import DataDir
from forkd.host import fusefile
from forkd.vmm import console

from .conftest import images_dir, qemu_processes_of

FORKD = Path(sys.executable).with_name("forkd")
START_TIMEOUT = 90.0  # the runtime opens (and re-adopts sandboxes) before /healthz answers
STOP_TIMEOUT = 60.0  # SIGTERM: uvicorn drains, then the runtime kills every sandbox


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_data_dir(prefix: str = "fkd-") -> Path:
    """A short (unix socket paths are limited to 107 bytes) throwaway data dir."""
    return DataDir.scratch(prefix).root


def write_token(root: Path) -> tuple[str, Path]:
    """A random 32-character token in ``<root>/token`` (mode 0600)."""
    token = secrets.token_hex(16)
    path = root / "token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return token, path


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def kill_qemus_of(root: Path) -> list[str]:
    """SIGKILL every QEMU whose command line names ``root`` (test clean-up); returns them. A daemon
    killed with SIGKILL also leaves its lazily arriving snapshots' FUSE mounts (a daemon that
    starts on ``root`` again detaches them itself): detach them, so nothing is left mounted."""
    leftover = qemu_processes_of(root)
    for line in leftover:
        pid = int(line.split()[0])
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for point in fusefile.mounts_under(root):
        with contextlib.suppress(OSError):
            fusefile.umount(point)
    return leftover


@dataclass
class Daemon:
    """One ``forkd daemon`` process (restartable on the same data dir, token and port)."""

    root: Path
    token: str
    token_file: Path
    port: int
    tls_cert: Path | None = None
    tls_key: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    # FORKD_* settings for the daemon's environment (the caller's own FORKD_* are never passed on).
    extra_env: dict[str, str] = field(default_factory=dict)
    # "cli": `forkd daemon ...`; "module": `python -m forkd.api ...` (docs/API.md's spelling).
    entry: str = "cli"
    # Where it listens, and what runs it: ``ip netns exec NS`` puts it on another "machine"
    # (tests/integration/netns.py); such a launcher execs the daemon, so proc.pid stays its pid.
    host: str = "127.0.0.1"
    launcher: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    # Sandboxes a test leaves running on purpose, for the SIGTERM shutdown to stop.
    left_for_shutdown: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls_cert else 'http'}://{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.root / "daemon.log"

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def argv(self) -> list[str]:
        command = [str(FORKD), "daemon"] if self.entry == "cli" else [sys.executable, "-m", "forkd.api"]
        argv = [
            *self.launcher,
            *command,
            "--bind", f"{self.host}:{self.port}",
            "--data-dir", str(self.root),
            "--token-file", str(self.token_file),
        ]
        if self.tls_cert and self.tls_key:
            argv += ["--tls-cert", str(self.tls_cert), "--tls-key", str(self.tls_key)]
        return argv + self.extra_args

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FORKD_")}
        env["FORKD_IMAGES_DIR"] = str(images_dir())
        # Where the daemon copies a sandbox's console as its run directory goes: a failed test
        # keeps the consoles of the VMs it killed (conftest.py), the daemon's as well as its own.
        if keep := os.environ.get(console.KEEP_DIR_ENV):
            env[console.KEEP_DIR_ENV] = keep
        env.update(self.extra_env)
        return env

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no daemon log)"

    def client(self, token: str | None = "default", timeout: float = 120.0) -> httpx.Client:
        """An httpx client for this daemon; ``token=None`` sends no Authorization header."""
        headers = self.auth if token == "default" else (
            {} if token is None else {"Authorization": f"Bearer {token}"}
        )
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout, verify=self.verify())

    def verify(self) -> ssl.SSLContext | bool:
        """What a client must trust: the daemon's self-signed certificate when it serves TLS."""
        return ssl.create_default_context(cafile=str(self.tls_cert)) if self.tls_cert else True

    def start(self) -> Daemon:
        assert self.proc is None or self.proc.poll() is not None, "daemon already running"
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start #{self.starts}: {' '.join(self.argv())}\n".encode())
            log.flush()
            # No shell, no wrapper: proc.pid is the daemon itself, so kill -9 hits it.
            self.proc = subprocess.Popen(
                self.argv(), env=self.env(), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, cwd=self.root,
            )
        self.wait_healthy()
        return self

    def wait_healthy(self, timeout: float = START_TIMEOUT) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        verify = self.verify()
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"forkd daemon exited with {self.proc.returncode} during start-up:\n{self.log_tail()}"
                )
            try:
                r = httpx.get(f"{self.url}/healthz", timeout=2, verify=verify)
                if r.status_code == 200 and r.json() == {"ok": True}:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"forkd daemon did not answer /healthz within {timeout}s:\n{self.log_tail()}")

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM and wait (SIGKILL if it hangs). Returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                raise RuntimeError(f"daemon ignored SIGTERM for {timeout}s:\n{self.log_tail()}") from None
        return self.proc.returncode

    def kill9(self) -> None:
        """``kill -9`` the daemon process itself (its QEMUs run in their own sessions)."""
        assert self.proc is not None and self.proc.poll() is None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def new_daemon(prefix: str = "fkd-", **kwargs: object) -> Daemon:
    root = make_data_dir(prefix)
    token, token_file = write_token(root)
    return Daemon(root=root, token=token, token_file=token_file, port=free_port(), **kwargs)  # type: ignore[arg-type]


def start_or_clean_up(daemon: Daemon) -> Daemon:
    """Start ``daemon``; if it does not come up, stop it and its QEMUs before re-raising."""
    try:
        return daemon.start()
    except BaseException:
        daemon.stop()
        kill_qemus_of(daemon.root)
        raise


def kill_leftover_sandboxes(daemon: Daemon, keep: Iterable[str] = ()) -> list[str]:
    """Kill every sandbox of a running ``daemon`` but ``keep``; returns the ids it killed."""
    if daemon.proc is None or daemon.proc.poll() is not None:
        return []
    kept = set(keep)
    with daemon.client() as c:
        left = [sb["id"] for sb in c.get("/v1/sandboxes").json() if sb["id"] not in kept]
        for sb_id in left:
            c.delete(f"/v1/sandboxes/{sb_id}")
    return left


def shutdown_and_check(daemon: Daemon) -> None:
    """Stop the daemon with SIGTERM, then fail if any of its QEMUs is still running.

    Leftovers are killed before the assertion so that a failing test never
    leaves VMs behind.
    """
    running = qemu_processes_of(daemon.root)
    try:
        status = daemon.stop()
    finally:
        leftover = kill_qemus_of(daemon.root)
    print(f"\nSIGTERM: daemon exited with {status}, stopping {len(running)} running QEMU(s)")
    assert not leftover, f"QEMU processes left behind by the daemon: {leftover}"
    # uvicorn finishes its graceful shutdown, then re-raises the signal it caught.
    assert status in (0, -signal.SIGTERM), f"daemon exited with {status} on SIGTERM:\n{daemon.log_tail()}"
    shutil.rmtree(daemon.root, ignore_errors=True)


def ok(r: httpx.Response) -> Any:
    """A successful answer's JSON (None if empty); the body in the failure otherwise."""
    assert r.status_code < 300, r.text
    return r.json() if r.content else None


def evaluate(c: httpx.Client, sb_id: str, code: str) -> str:
    """``code`` evaluated in the sandbox, which must succeed: its result."""
    out = ok(c.post(f"/v1/sandboxes/{sb_id}/eval", json={"code": code}))
    assert out["exit_code"] == 0, out
    return str(out["result"])


# Every shared daemon is started with these on top of its own flags: a non-default bound that
# test_files checks the daemon obeys (a 413 past it), which no other test comes near.
SHARED_MAX_FILE_BYTES = 200 << 20
SHARED_FLAGS = ("--max-file-bytes", str(SHARED_MAX_FILE_BYTES))

# A template's recipe is its POST /v1/snapshots body less what does not change what it holds.
_NOT_CONTENT = ("tag", "boot_wait_secs")


class SharedDaemons:
    """The session's shared daemons, one per set of flags, and their templates, one boot per tag.

    Booting a template costs 10-30 s under TCG and starting a daemon a few more, so every module
    that does not test the daemon's own start, stop or flags asks here (``shared_daemons``
    fixture) instead of starting its own. Modules run one after another in the session, so a
    module has the daemon to itself while it runs, but not its state: other modules' templates
    and branches are there. Tests on a shared daemon look at their own tags and ids, never at
    the whole list; :meth:`lend` kills what a module left running when it ends. A test may stop
    or restart a shared daemon (same data dir, token and port): the next module gets it running.
    """

    def __init__(self, seed: Callable[[Path], None] | None = None,
                 seeded: dict[str, dict[str, Any]] | None = None) -> None:
        """``seed(root)`` registers, in a new daemon's data dir before it starts, the templates
        ``seeded`` names (tag: recipe), which another runtime of the session already booted."""
        self._seed = seed
        self._seeded = dict(seeded or {})
        self._daemons: dict[tuple[tuple[str, ...], tuple[tuple[str, str], ...]], Daemon] = {}
        self._templates: dict[tuple[Path, str], dict[str, Any]] = {}

    def daemon(self, *extra_args: str, **extra_env: str) -> Daemon:
        """The running shared daemon started with these flags (started on first use)."""
        key = (tuple(extra_args), tuple(sorted(extra_env.items())))
        d = self._daemons.get(key)
        if d is None:
            d = new_daemon("fks-", extra_args=[*SHARED_FLAGS, *extra_args], extra_env=dict(extra_env))
            if self._seed is not None:
                self._seed(d.root)
                for tag, recipe in self._seeded.items():
                    self._templates[(d.root, tag)] = {"body": {"tag": tag, **recipe}, "info": None}
            start_or_clean_up(d)
            self._daemons[key] = d
        elif d.proc is None or d.proc.poll() is not None:
            d.start()  # a test stopped it (a restart test): same data dir, port and token
        return d

    def template(self, daemon: Daemon, tag: str, **recipe: Any) -> dict[str, Any]:
        """``tag`` booted from ``recipe`` on ``daemon`` once a session; its POST /v1/snapshots answer.

        Asking again for a tag with another recipe is an error, not a silent share.
        """
        body = {"tag": tag, **recipe}
        key = (daemon.root, tag)
        known = self._templates.get(key)
        if known is not None:
            mine = {k: v for k, v in body.items() if k not in _NOT_CONTENT}
            theirs = {k: v for k, v in known["body"].items() if k not in _NOT_CONTENT}
            assert mine == theirs, f"template {tag!r} was booted from {theirs}, not {mine}: use another tag"
            if known["info"] is None:  # seeded: its entry in the daemon's list, as POST answered it
                with daemon.client() as c:
                    known["info"] = next(s for s in c.get("/v1/snapshots").json() if s["tag"] == tag)
            return dict(known["info"])
        with daemon.client(timeout=900) as c:
            started = time.monotonic()
            r = c.post("/v1/snapshots", json=body)
            assert r.status_code == 201, r.text
        print(f"\nshared template {tag!r} (boot + snapshot): {time.monotonic() - started:.1f} s")
        self._templates[key] = {"body": body, "info": r.json()}
        return dict(r.json())

    def templates_of(self, daemon: Daemon) -> set[str]:
        """The tags this factory booted on ``daemon`` (other modules' templates among them)."""
        return {tag for root, tag in self._templates if root == daemon.root}

    @contextlib.contextmanager
    def lend(self, *extra_args: str, **extra_env: str) -> Iterator[Daemon]:
        """The shared daemon for one module; after it, what the module left running is killed and
        the snapshots it made (not the factory's templates) are deleted, so the next starts clean."""
        d = self.daemon(*extra_args, **extra_env)
        with d.client() as c:
            before = {s["tag"] for s in c.get("/v1/snapshots").json()}
        yield d
        if d.proc is None or d.proc.poll() is not None:
            return  # a test stopped it: the next module's daemon() starts it again
        kill_leftover_sandboxes(d)
        with d.client(timeout=300) as c:
            made = {s["tag"] for s in c.get("/v1/snapshots").json()} - before - self.templates_of(d)
            for tag in sorted(made):
                r = c.delete(f"/v1/snapshots/{tag}", params={"cascade": "true", "force": "true"})
                assert r.status_code in (204, 404), r.text

    def close(self) -> None:
        """SIGTERM every shared daemon; fail if one leaves a QEMU or a live fork's memory behind."""
        from forkd.host.shm import ShmMemory

        errors: list[str] = []
        for d in self._daemons.values():
            shm = ShmMemory(d.root).dir
            try:
                shutdown_and_check(d)
                assert not shm.exists(), f"live_fork memory left on /dev/shm: {sorted(shm.iterdir())}"
            except (AssertionError, RuntimeError) as exc:
                errors.append(str(exc))
        assert not errors, "\n".join(errors)
