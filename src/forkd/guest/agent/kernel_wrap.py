"""What forkd's bash and JavaScript kernels share: a Jupyter kernel wrapped around one child process.

This is ipykernel's documented wrapper-kernel pattern (a subclass of
``ipykernel.kernelbase.Kernel`` that implements ``do_execute``): this process
speaks Jupyter's protocol, and the language runs in one long-lived child (bash,
node) whose state persists from cell to cell. ``kernel_runner.py`` starts these
kernels through kernel.json files of its own (``kernel_specs``); like the
runner, they run with the guest's python3 and the agent never imports them.

The child runs in a session of its own, so the SIGINT with which jupyter_client
interrupts the kernel's process group reaches this process alone, which passes
it on to the child's group (again every ``REINTERRUPT_SECS`` while the cell goes
on, as one presses Ctrl-C again). A child that has not ended the cell
``INTERRUPT_GRACE_SECS`` later (it ignores SIGINT) is killed and started anew,
and so is one that exits; the cell's error says so, and that the state is lost.
The child dies with this process (``PR_SET_PDEATHSIG``), however it ends.

The child's stdout and stderr are pipes, read by a thread each: what a cell
writes goes out as Jupyter ``stream`` messages as it comes. The child ends each
request with ``mark`` (random, so no cell prints it by chance) and a line on
each pipe; the stdout line carries its answer (``answer``). Cell metadata
``forkd_env`` ({name: value}) sets environment variables for that cell alone; an
empty cell with ``forkd_restored`` ({"env", "seed"}) tells the kernel of a
restored copy of the guest its new environment and a new random seed.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from ipykernel.kernelapp import IPKernelApp
from ipykernel.kernelbase import Kernel

INTERRUPT_GRACE_SECS = 2.0  # within the runner's own grace (5 s), after which it restarts the kernel
REINTERRUPT_SECS = 0.5  # the interrupt again, while the cell has not ended
START_TIMEOUT_SECS = 60.0
READ_CHUNK = 64 << 10
PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _child_setup() -> None:
    """In the child: it dies with this kernel, and takes SIGINT again (ipykernel ignores it between
    requests, and an ignored signal stays ignored across exec)."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    _libc.signal(signal.SIGINT, 0)  # SIG_DFL, without Python's main-thread rule


def popen(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """The child: its own session, stdout and stderr pipes, and death with this kernel."""
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=_child_setup, **kwargs)


class ChildKernel(Kernel):
    """A kernel whose cells run in one child process; subclasses start it and hand it cells."""

    implementation = "forkd"
    implementation_version = "1"
    banner = ""
    child_name = "the child"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]  # ipykernel's are untyped
        self.mark = "\x1eforkd-" + os.urandom(8).hex()
        self.events: queue.Queue[tuple[object, str, str | None]] = queue.Queue()
        self.child: subprocess.Popen[bytes] | None = None
        self.lost_why = ""
        self.start_child()

    # ------------------------------------------------------------ for subclasses

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start the child with ``popen``; it ends its start-up with the mark, as a request."""
        raise NotImplementedError

    def submit(self, code: str, env: dict[str, str]) -> None:
        """Hand the child one cell, with these environment variables for it alone."""
        raise NotImplementedError

    def restored(self, env: dict[str, str], seed: str) -> None:
        """A restored copy: the child takes ``env`` and reseeds its random numbers with ``seed`` (hex)."""
        raise NotImplementedError

    def answer(self, payload: str, silent: bool) -> dict[str, Any]:
        """The end of a cell (what followed the mark on stdout): its result or error sent, its reply."""
        raise NotImplementedError

    def closed(self) -> None:
        """The child is gone: close what this side kept of it."""

    # ---------------------------------------------------------------- the child

    def start_child(self) -> None:
        child = self.child = self.spawn()
        for name, pipe in (("stdout", child.stdout), ("stderr", child.stderr)):
            threading.Thread(target=self._read, args=(child, name, pipe), daemon=True,
                             name=f"{name}-reader").start()
        if self.collect(silent=True, timeout=START_TIMEOUT_SECS) is None:  # start-up noise dropped
            raise RuntimeError(f"{self.child_name} did not start: {self.lost_why}")

    def stop_child(self) -> None:
        child, self.child = self.child, None
        if child is None:
            return
        with contextlib.suppress(OSError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        self.closed()

    def _read(self, child: object, name: str, pipe: Any) -> None:
        """One of the child's pipes, as text events and the ends of requests (``name``-end)."""
        mark = self.mark.encode()
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        held = b""
        while data := os.read(pipe.fileno(), READ_CHUNK):
            held += data
            while (at := held.find(mark)) >= 0 and (eol := held.find(b"\n", at)) >= 0:
                self._text(child, name, decoder.decode(held[:at]))
                self.events.put((child, f"{name}-end", held[at + len(mark):eol].decode("utf-8", "replace")))
                held = held[eol + 1:]
            cut = held.rfind(b"\x1e")  # keep back what may be the start of a mark
            if cut < 0 or not (mark.startswith(held[cut:]) or held[cut:].startswith(mark)):
                cut = len(held)
            self._text(child, name, decoder.decode(held[:cut]))
            held = held[cut:]
        self._text(child, name, decoder.decode(held, final=True))
        pipe.close()
        self.events.put((child, "eof", None))

    def _text(self, child: object, name: str, text: str) -> None:
        if text:
            self.events.put((child, name, text))

    def collect(self, silent: bool, timeout: float | None = None) -> str | None:
        """Stream the child's output until it ends the request: the stdout end's payload, or None
        when it exited or ignored an interrupt (``lost_why`` says which)."""
        child, ends, interrupted = self.child, dict[str, str](), 0.0
        deadline = None if timeout is None else time.monotonic() + timeout
        self.lost_why = "it did not answer in time"
        while len(ends) < 2:
            try:
                try:
                    source, kind, text = self.events.get(timeout=0.1)
                except queue.Empty:
                    if deadline is not None and time.monotonic() > deadline:
                        return None
                    if interrupted and time.monotonic() - interrupted > REINTERRUPT_SECS:
                        interrupted = self._interrupt(child)
                    continue
                if source is not child:
                    continue  # what a child that is gone wrote last
                if text is None:
                    status = None
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        status = child.wait(5) if isinstance(child, subprocess.Popen) else None
                    self.lost_why = f"it exited (status {status})"
                    return None
                if kind.endswith("-end"):
                    ends[kind] = text
                elif not silent:
                    self.publish("stream", {"name": kind, "text": text})
            except KeyboardInterrupt:  # the kernel's interrupt: passed on to the child's group
                interrupted = self._interrupt(child)
                if deadline is None or deadline - time.monotonic() > INTERRUPT_GRACE_SECS:
                    deadline = time.monotonic() + INTERRUPT_GRACE_SECS
                self.lost_why = f"it did not stop within {INTERRUPT_GRACE_SECS:g}s of the interrupt"
        return ends["stdout-end"]

    def _interrupt(self, child: object) -> float:
        """SIGINT to the child's group; when. Sent again while the cell goes on: bash, for one, lets
        a loop go on when the command that got the signal exited without dying of it."""
        if isinstance(child, subprocess.Popen):
            with contextlib.suppress(OSError):
                os.killpg(child.pid, signal.SIGINT)
        return time.monotonic()

    # ------------------------------------------------------------------ Jupyter

    def publish(self, msg_type: str, content: dict[str, Any]) -> None:
        """An iopub message of the cell that runs."""
        self.send_response(self.iopub_socket, msg_type, content)  # type: ignore[no-untyped-call]

    def ok(self) -> dict[str, Any]:
        return {"status": "ok", "execution_count": self.execution_count, "payload": [],
                "user_expressions": {}}

    def error(self, name: str, value: str, traceback: list[str], silent: bool) -> dict[str, Any]:
        content = {"ename": name, "evalue": value, "traceback": traceback}
        if not silent:
            self.publish("error", content)
        return {"status": "error", "execution_count": self.execution_count, **content}

    def do_execute(self, code: str, silent: bool, store_history: bool = True,
                   user_expressions: dict[str, Any] | None = None, allow_stdin: bool = False,
                   **_more: Any) -> dict[str, Any]:
        metadata = self.get_parent().get("metadata") or {}  # type: ignore[no-untyped-call]
        restored, env = metadata.get("forkd_restored"), metadata.get("forkd_env")
        if isinstance(restored, dict):
            self.restored({str(k): str(v) for k, v in dict(restored.get("env") or {}).items()},
                          str(restored.get("seed") or ""))
        elif code.strip():
            self.submit(code, {str(k): str(v) for k, v in (env.items() if isinstance(env, dict) else ())})
        else:
            return self.ok()
        payload = self.collect(silent)
        if payload is not None:
            return self.answer(payload, silent)
        why = self.lost_why
        self.stop_child()
        self.start_child()
        return self.error("KernelRestarted", f"{self.child_name} was restarted, and the kernel's state "
                          f"lost with it: {why}", [], silent)

    def do_shutdown(self, restart: bool) -> dict[str, Any]:
        self.stop_child()
        return {"status": "ok", "restart": restart}


def launch(kernel: Callable[..., ChildKernel]) -> None:
    """Serve a kernel, as ``python3 KERNEL.py -f CONNECTION_FILE`` (its kernel.json's argv)."""
    IPKernelApp.launch_instance(kernel_class=kernel)
