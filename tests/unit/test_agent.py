"""Unit tests of the in-guest agent, run on the host over pipes (``--stdio``).

The agent is a stdlib-only package that normally runs as PID 1 in a microVM; its
``--stdio`` mode serves the very same protocol on stdin/stdout, so everything
but the virtio-serial port and the PID-1 set-up is exercised here without QEMU.
The process tests run it as the guest does: installed by ``rootfs.install_agent``
into a tree, started by the path that init.sh uses. The module tests call the
package's modules directly.

Never send the ``restored`` action with ``time_ns`` from these tests: the agent
runs as root on the host and would step the host's clock.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from forkd.guest import protocol
from forkd.guest.agent import evaluator, reaper, server
from forkd.guest.agent import spawn as agent_spawn
from forkd.guest.protocol import RequestError
from forkd.image import rootfs

REPLY_TIMEOUT = 15.0  # generous: the host is a noisy 2-core machine


class AgentProcess:
    """A ``--stdio`` agent plus a reader thread that files replies and events by id.

    As the host client does, ``request`` puts an exec's output (streamed as events
    ahead of its reply) back into the result as ``stdout``/``stderr`` text.
    """

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.replies: dict[Any, list[dict[str, Any]]] = {}
        self.events: dict[Any, list[dict[str, Any]]] = {}
        self.cond = threading.Condition()
        self.next_id = 0
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            reply = json.loads(raw)  # a non-JSON line here is a test failure
            with self.cond:
                if "event" in reply:
                    self.events.setdefault(reply["id"], []).append(reply["event"])
                else:
                    self.replies.setdefault(reply.get("id"), []).append(reply)
                self.cond.notify_all()
        with self.cond:  # EOF: wake waiters so they fail fast instead of timing out
            self.cond.notify_all()

    def send_raw(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, action: str, **fields: Any) -> int:
        self.next_id += 1
        self.send_raw(json.dumps({"id": self.next_id, "action": action, **fields}).encode() + b"\n")
        return self.next_id

    def wait(self, req_id: Any, timeout: float = REPLY_TIMEOUT) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self.replies.get(req_id):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no reply to request {req_id!r} within {timeout}s")
                if not self.reader.is_alive():
                    raise RuntimeError(f"agent exited (rc={self.proc.poll()}) before replying")
                self.cond.wait(remaining)
            return self.replies[req_id].pop(0)

    def request(self, action: str, **fields: Any) -> dict[str, Any]:
        req_id = self.send(action, **fields)
        reply = self.wait(req_id)
        assert set(reply) >= {"id", "ok"}
        if action == "exec" and reply["ok"]:
            with_output(reply["result"], self.events.pop(req_id, []))
        return reply

    def output(self, req_id: Any) -> dict[str, bytes]:
        """The stdout and stderr events received so far for ``req_id``, joined."""
        with self.cond:
            events = list(self.events.get(req_id, []))
        return {name: b"".join(base64.b64decode(e["data"]) for e in events if e["type"] == name)
                for name in ("stdout", "stderr")}

    def result(self, action: str, **fields: Any) -> dict[str, Any]:
        reply = self.request(action, **fields)
        assert reply["ok"] is True, reply
        result: dict[str, Any] = reply["result"]
        return result


def with_output(result: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any]:
    for name in ("stdout", "stderr"):
        data = b"".join(base64.b64decode(e["data"]) for e in events if e["type"] == name)
        result[name] = data.decode("utf-8", "replace")
    return result


@pytest.fixture(scope="module")
def guest_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tree with the agent installed as the image builder installs it."""
    root = tmp_path_factory.mktemp("guest-root")
    rootfs.install_agent(root)
    return root


def _start_agent(root: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-u", str(root / rootfs.AGENT_ENTRY), "--stdio"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )


@contextlib.contextmanager
def running_agent(root: Path) -> Iterator[AgentProcess]:
    """The installed agent under ``root``, over pipes; always killed at the end (a failed
    assertion must not leave an agent running)."""
    proc = _start_agent(root)
    try:
        yield AgentProcess(proc)
    finally:
        proc.kill()
        proc.wait(timeout=10)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def agent(guest_root: Path) -> Iterator[AgentProcess]:
    with running_agent(guest_root) as running:
        yield running


def _proc_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` from /proc, or None if it no longer exists."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[0]


def _wait_dead(pid: int, timeout: float = 5.0) -> str | None:
    """Poll until ``pid`` is gone or a zombie; returns its last state."""
    deadline = time.monotonic() + timeout
    state = _proc_state(pid)
    while state not in (None, "Z", "X") and time.monotonic() < deadline:
        time.sleep(0.02)
        state = _proc_state(pid)
    return state


def _read_pid(path: Path, timeout: float = 5.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text().strip() if path.exists() else ""
        if text:
            return int(text)
        time.sleep(0.02)
    raise AssertionError(f"{path} was never written")


# ------------------------------------------------------------------------- ping


def test_ping(agent: AgentProcess) -> None:
    reply = agent.request("ping")
    assert reply["id"] == 1
    result = reply["result"]
    assert result["pong"] is True
    assert result["pid"] == agent.proc.pid
    # numpy may or may not be importable on the host; the key is always there.
    assert "numpy_version" in result
    assert result["warm"] == ["numpy"]  # the default when /proc/cmdline has no forkd.warm=
    if result["numpy_version"] is None:
        assert "numpy" in result["warm_errors"]


# ------------------------------------------------------------------------- exec


def test_exec_prints(agent: AgentProcess) -> None:
    result = agent.result("exec", args=["python3", "-c", "print(2+2)"])
    assert result["stdout"] == "4\n"
    assert result["stderr"] == ""
    assert result["exit_code"] == 0
    assert result["error"] is None
    assert result["timed_out"] is False
    assert result["stdout_bytes"] == 2
    assert result["stdout_truncated"] is False
    assert result["duration_ms"] >= 0


def test_exec_stdin_env_cwd(agent: AgentProcess, tmp_path: Path) -> None:
    script = 'import os, sys; print(sys.stdin.read().upper(), os.environ["GREETING"], os.getcwd())'
    result = agent.result(
        "exec",
        args=["python3", "-c", script],
        stdin="hello",
        env={"GREETING": "bonjour"},
        cwd=str(tmp_path),
    )
    assert result["exit_code"] == 0, result
    assert result["stdout"] == f"HELLO bonjour {tmp_path}\n"


def test_exec_without_stdin_reads_eof(agent: AgentProcess) -> None:
    # No stdin given: the child must see EOF at once, not inherit the protocol pipe.
    result = agent.result("exec", args=["cat"], timeout_secs=5)
    assert result["timed_out"] is False
    assert result["stdout"] == ""
    assert result["exit_code"] == 0


def test_exec_missing_binary(agent: AgentProcess) -> None:
    result = agent.result("exec", args=["no-such-binary-forkd-test", "x"])
    assert result["exit_code"] == 127
    assert "no-such-binary-forkd-test" in result["error"]
    assert "not found" in result["error"]
    assert result["timed_out"] is False


def test_exec_missing_cwd(agent: AgentProcess, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    result = agent.result("exec", args=["true"], cwd=str(missing))
    assert result["exit_code"] == 127
    assert "working directory" in result["error"]
    assert str(missing) in result["error"]


def test_exec_nonzero_exit(agent: AgentProcess) -> None:
    result = agent.result("exec", args=["sh", "-c", "echo oops >&2; exit 3"])
    assert result["exit_code"] == 3
    assert result["stderr"] == "oops\n"
    assert result["error"] is None  # a failing command is not an agent error


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "'args'"),
        ({"args": []}, "'args'"),
        ({"args": ["true", 1]}, "'args'"),
        ({"args": ["true"], "timeout_secs": 0}, "timeout_secs"),
        ({"args": ["true"], "max_output_bytes": -1}, "max_output_bytes"),
        ({"args": ["true"], "env": {"A": 1}}, "'env'"),
        ({"args": ["true"], "cwd": 5}, "'cwd'"),
        ({"args": ["true"], "stdin": 5}, "'stdin'"),
    ],
)
def test_exec_rejects_bad_requests(agent: AgentProcess, fields: dict[str, Any], message: str) -> None:
    reply = agent.request("exec", **fields)
    assert reply["ok"] is False
    assert message in reply["error"]


def test_exec_timeout_kills_process_group(agent: AgentProcess, tmp_path: Path) -> None:
    pidfile = tmp_path / "bg.pid"
    shfile = tmp_path / "sh.pid"
    started = time.monotonic()
    result = agent.result(
        "exec",
        args=["sh", "-c", f"sleep 30 & echo $! > {pidfile}; echo $$ > {shfile}; sleep 30"],
        timeout_secs=1,
    )
    elapsed = time.monotonic() - started
    assert result["timed_out"] is True
    assert result["exit_code"] == 124
    assert "timed out" in result["error"]
    assert elapsed < 8, f"timeout of 1s took {elapsed:.1f}s"
    # The background sleep is in the same process group, so it died too. On the
    # host it is re-parented to an init that may not reap it: a zombie is dead.
    for pid in (_read_pid(pidfile), _read_pid(shfile)):
        assert _wait_dead(pid) in (None, "Z", "X"), f"pid {pid} survived the timeout"


def test_exec_stdin_not_read_does_not_block_timeout(agent: AgentProcess) -> None:
    # More stdin than a pipe holds, to a child that never reads it: the timeout
    # must still fire (stdin is fed from its own thread).
    started = time.monotonic()
    result = agent.result("exec", args=["sleep", "10"], stdin="x" * (1 << 20), timeout_secs=0.5)
    assert result["timed_out"] is True
    assert result["exit_code"] == 124
    assert time.monotonic() - started < 5


def test_exec_background_process_does_not_hold_the_answer(
    agent: AgentProcess, tmp_path: Path
) -> None:
    # The command exits at once but leaves a process holding its stdout open:
    # the answer comes after a short grace period, with the output so far.
    pidfile = tmp_path / "bg.pid"
    started = time.monotonic()
    result = agent.result(
        "exec", args=["sh", "-c", f"echo out; sleep 30 & echo $! > {pidfile}"], timeout_secs=20
    )
    elapsed = time.monotonic() - started
    try:
        assert result["exit_code"] == 0
        assert result["timed_out"] is False
        assert result["stdout"] == "out\n"
        assert elapsed < 5, f"exec waited {elapsed:.1f}s for a background process"
    finally:
        os.kill(_read_pid(pidfile), 9)  # not a child of ours: just make it go away


def test_exec_output_cap(agent: AgentProcess) -> None:
    result = agent.result(
        "exec",
        args=["python3", "-c", "import sys; sys.stdout.write('x' * 100000); sys.stderr.write('e')"],
        max_output_bytes=10,
    )
    assert result["exit_code"] == 0
    assert result["stdout"] == "x" * 10
    assert result["stdout_truncated"] is True
    assert result["stdout_bytes"] == 100000
    assert result["stderr"] == "e"
    assert result["stderr_truncated"] is False
    assert result["stderr_bytes"] == 1


# ------------------------------------------------------------------------- eval


def test_eval_expression(agent: AgentProcess) -> None:
    assert agent.result("eval", code="1 + 2") == {"result": "3", "error": None, "exit_code": 0}
    assert agent.result("eval", code="'a' * 3")["result"] == "'aaa'"


def test_eval_statements_then_expression(agent: AgentProcess) -> None:
    result = agent.result("eval", code="x = 6\ny = 7\nx * y")
    assert result == {"result": "42", "error": None, "exit_code": 0}


def test_eval_namespace_persists(agent: AgentProcess) -> None:
    agent.result("eval", code="import math\ncounter = 41\ndef bump(n):\n    return n + 1")
    assert agent.result("eval", code="bump(counter)")["result"] == "42"
    assert agent.result("eval", code="math.sqrt(16)")["result"] == "4.0"


def test_eval_exception(agent: AgentProcess) -> None:
    result = agent.result("eval", code="1 / 0")
    assert result["result"] is None
    assert result["error"].startswith("ZeroDivisionError: ")
    assert result["exit_code"] == 1
    # The agent survives an exception and even SystemExit in eval'd code.
    assert agent.result("eval", code="raise SystemExit(3)")["error"] == "SystemExit: 3"
    assert agent.result("eval", code="2")["result"] == "2"


def test_eval_syntax_error(agent: AgentProcess) -> None:
    result = agent.result("eval", code="def (:")
    assert result["result"] is None
    assert result["error"].startswith("SyntaxError")
    assert result["exit_code"] == 1


def test_eval_needs_code(agent: AgentProcess) -> None:
    reply = agent.request("eval", code=5)
    assert reply["ok"] is False
    assert "code" in reply["error"]


def test_eval_print_does_not_corrupt_protocol(agent: AgentProcess) -> None:
    # In --stdio mode fd 1 is the reply channel; eval'd prints must not land there
    # (the reader thread would fail on a non-JSON line), nor input() eat requests.
    result = agent.result("eval", code="print('not json')\n7")
    assert result["result"] == "7"
    assert agent.result("eval", code="input()")["error"].startswith("EOFError")
    assert agent.result("ping")["pong"] is True


# ----------------------------------------------------------------- eval timeout


def test_eval_timeout_interrupts_and_the_next_eval_runs(agent: AgentProcess) -> None:
    agent.result("eval", code="counter = 0")
    started = time.monotonic()
    result = agent.result("eval", code="while True:\n    counter += 1", timeout_secs=0.5)
    elapsed = time.monotonic() - started
    assert result == {"result": None, "error": "TimeoutError: eval exceeded 0.5 s", "exit_code": 1}
    assert elapsed < 5, f"a 0.5 s eval timeout took {elapsed:.1f}s"
    # The evaluator is free again, and the namespace kept what the loop did.
    assert int(agent.result("eval", code="counter", timeout_secs=5)["result"]) > 0
    assert int(agent.result("ping")["agent_version"]) >= 2  # 2 brought eval timeouts


@pytest.mark.parametrize("value", [0, -1, "10", True, None, [1]])
def test_eval_rejects_bad_timeouts(agent: AgentProcess, value: object) -> None:
    reply = agent.request("eval", code="1", timeout_secs=value)
    assert reply["ok"] is False
    assert "'timeout_secs' must be a positive number" in reply["error"]


def test_eval_rejects_non_finite_timeouts(agent: AgentProcess) -> None:
    for literal in (b"NaN", b"Infinity"):  # what json.dumps writes for float('nan'), float('inf')
        agent.send_raw(b'{"id": "t", "action": "eval", "code": "1", "timeout_secs": ' + literal + b"}\n")
        reply = agent.wait("t")
        assert reply["ok"] is False and "timeout_secs" in reply["error"]


def test_module_eval_timeout_frees_the_evaluator() -> None:
    ev = evaluator.Evaluator({})
    result = ev.evaluate("while True: pass", timeout_secs=0.2)
    assert result == {"result": None, "error": "TimeoutError: eval exceeded 0.2 s", "exit_code": 1}
    deadline = time.monotonic() + 5
    while ev.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not ev.busy
    assert ev.evaluate("1 + 1")["result"] == "2"
    # Two threads for all evals, kept (no thread per eval), and idle now.
    assert sorted(t.name for t in ev._threads) == ["forkd-eval", "forkd-eval-watchdog"]
    before = {t.ident for t in threading.enumerate()}
    for _ in range(20):
        assert ev.evaluate("2 * 2")["result"] == "4"
    assert {t.ident for t in threading.enumerate()} == before


@pytest.mark.parametrize(
    "code",
    [
        # catches the interruption and carries on: it is raised again
        "while True:\n    try:\n        while True: pass\n    except BaseException:\n        pass",
        # `except Exception` does not see it at all
        "while True:\n    try:\n        while True: pass\n    except Exception:\n        pass",
        # user code runs in repr() too
        "class Loop:\n    def __repr__(self):\n        while True: pass\nLoop()",
    ],
    ids=["bare-except", "except-exception", "repr"],
)
def test_module_eval_timeout_cannot_be_swallowed(code: str) -> None:
    ev = evaluator.Evaluator({})
    assert ev.evaluate(code, timeout_secs=0.2)["error"] == "TimeoutError: eval exceeded 0.2 s"
    assert ev.evaluate("'free'", timeout_secs=5)["result"] == "'free'"


def test_module_eval_blocked_in_c_answers_on_time() -> None:
    """A C call cannot be interrupted: the answer still comes on time, and the
    evaluator is busy until the call returns; later evals wait within their own limit."""
    ev = evaluator.Evaluator({}, interrupt_grace=0.2)
    started = time.monotonic()
    result = ev.evaluate("import time\ntime.sleep(1.5)\nfinished = True", timeout_secs=0.2)
    assert time.monotonic() - started < 1.2
    assert result["exit_code"] == 1
    assert result["error"].startswith("TimeoutError: eval exceeded 0.2 s; it is inside a call")
    busy = ev.evaluate("1", timeout_secs=0.1)
    assert busy["error"] == (
        "TimeoutError: eval exceeded 0.1 s waiting for an earlier eval that is still running"
    )
    # Once sleep() returns, the pending interruption stops the rest of that eval.
    assert ev.evaluate("2", timeout_secs=10)["result"] == "2"
    assert "time" in ev.namespace and "finished" not in ev.namespace


def test_module_eval_results_unchanged_by_the_timeout_machinery() -> None:
    ev = evaluator.Evaluator({})
    for _ in range(50):  # a fast eval never sees an interruption meant for a slow one
        assert ev.evaluate("sum(range(100))", timeout_secs=5)["result"] == "4950"
    assert ev.evaluate("raise KeyboardInterrupt", timeout_secs=5)["error"] == "KeyboardInterrupt: "
    assert ev.evaluate("return 1")["error"].endswith("SyntaxError: 'return' outside function")


def test_eval_defaults_to_the_protocol_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host that sends no timeout_secs still gets a bounded eval."""
    agent_obj = server.Agent([])
    seen: list[float] = []

    def spy(code: object, timeout_secs: float, reply: Any) -> None:
        seen.append(timeout_secs)

    monkeypatch.setattr(agent_obj.evaluator, "submit", spy)
    agent_obj.handle({"action": "eval", "code": "1"})
    agent_obj.handle({"action": "eval", "code": "1", "timeout_secs": 7})
    assert seen == [protocol.EVAL_DEFAULT_TIMEOUT_SECS, 7]
    assert evaluator.Evaluator.evaluate.__defaults__ == (protocol.EVAL_DEFAULT_TIMEOUT_SECS,)


# -------------------------------------------------------------------- protocol


def test_concurrent_requests(agent: AgentProcess) -> None:
    started = time.monotonic()
    ids: dict[int, str] = {}
    for i in range(10):
        ids[agent.send("exec", args=["sh", "-c", f"sleep 0.5; echo {i}"])] = f"{i}\n"
        ids[agent.send("eval", code=f"{i} * 10")] = repr(i * 10)
    for req_id, expected in ids.items():
        reply = agent.wait(req_id)
        assert reply["id"] == req_id and reply["ok"] is True
        result = reply["result"]
        if "result" not in result:  # an exec: its output came ahead as events
            result = with_output(result, agent.events.pop(req_id, []))
        assert result.get("stdout", result.get("result")) == expected
    elapsed = time.monotonic() - started
    assert elapsed < 3.0, f"20 requests took {elapsed:.2f}s; serially they take over 5s"


def test_malformed_line_then_keeps_serving(agent: AgentProcess) -> None:
    agent.send_raw(b"{this is not json\n")
    reply = agent.wait(None)
    assert reply["ok"] is False
    assert "malformed request" in reply["error"]
    agent.send_raw(b"\xff\xfe\x00garbage\n")
    assert agent.wait(None)["ok"] is False
    agent.send_raw(b"[1, 2]\n")
    reply = agent.wait(None)
    assert reply["ok"] is False and "JSON object" in reply["error"]
    agent.send_raw(b"\n   \n")  # blank lines are ignored, not answered
    assert agent.result("ping")["pong"] is True
    assert agent.replies.get(None) == []


def test_unknown_action(agent: AgentProcess) -> None:
    reply = agent.request("teleport")
    assert reply["ok"] is False
    assert reply["error"] == "unknown action 'teleport'"
    assert "result" not in reply


def test_restored_rejects_bad_entropy(agent: AgentProcess) -> None:
    # Only invalid requests: a valid one would reseed the host CRNG, and with
    # time_ns it would step the host clock (the agent runs as root here).
    reply = agent.request("restored", entropy="abcd")
    assert reply["ok"] is False
    assert "entropy" in reply["error"] and "16 bytes" in reply["error"]
    reply = agent.request("restored", entropy="zz" * 32)
    assert reply["ok"] is False
    assert "not valid hex" in reply["error"]
    assert agent.request("restored")["ok"] is False
    assert agent.result("ping")["restores"] == 0


def test_eof_answers_requests_in_flight(guest_root: Path) -> None:
    # `echo request | __main__.py --stdio` must answer before exiting at EOF.
    lines = [
        {"id": 1, "action": "exec", "args": ["sh", "-c", "sleep 0.3; echo late"]},
        {"id": 2, "action": "eval", "code": "40 + 2"},
    ]
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    proc = _start_agent(guest_root)
    try:
        out, _ = proc.communicate(data, timeout=REPLY_TIMEOUT)
    finally:
        proc.kill()
        proc.wait()
    messages = list(map(json.loads, out.splitlines()))
    replies = {r["id"]: r for r in messages if "event" not in r}
    events = [m["event"] for m in messages if "event" in m and m["id"] == 1]
    assert with_output(replies[1]["result"], events)["stdout"] == "late\n"
    assert replies[2]["result"]["result"] == "42"
    assert proc.returncode == 0


# --------------------------------------------------- the module, used directly


def test_module_evaluator() -> None:
    ev = evaluator.Evaluator({})
    assert ev.evaluate("a = [1, 2]\na.append(3)\na")["result"] == "[1, 2, 3]"
    assert ev.evaluate("len(a)")["result"] == "3"
    assert ev.evaluate("a = 1")["exit_code"] == 0
    assert ev.evaluate("undefined_name")["error"].startswith("NameError")
    with pytest.raises(RequestError):
        ev.evaluate(None)


def test_module_parse_exec() -> None:
    spec, cap = agent_spawn.parse_exec({"args": ["echo", "hi"], "stdin": "x", "env": {"A": "1"}})
    assert spec.args == ["echo", "hi"] and spec.stdin == b"x" and spec.env == {"A": "1"}
    assert spec.timeout_secs == protocol.EXEC_DEFAULT_TIMEOUT_SECS and cap == protocol.EXEC_OUTPUT_CAP
    with pytest.raises(RequestError):
        agent_spawn.parse_exec({"args": "echo hi"})
    start = agent_spawn.parse_start({"args": ["cat"], "stdin": True, "tag": "t", "input": "aGk="})
    assert start.keep_stdin_open and start.stdin == b"hi" and start.timeout_secs is None
    for bad in ({"stdin": "yes"}, {"tag": 5}, {"input": "***"}):
        with pytest.raises(RequestError):
            agent_spawn.parse_start({"args": ["cat"], **bad})


def test_module_reaper() -> None:
    """The reaper waits for zombie children it does not own, and leaves owned ones."""
    reaper_ = reaper.Reaper()
    orphan = os.posix_spawn("/bin/true", ["true"], dict(os.environ))
    owned = os.posix_spawn("/bin/true", ["true"], dict(os.environ))
    reaper_.owned.add(owned)
    try:
        assert _wait_dead(orphan) == "Z" and _wait_dead(owned) == "Z"
        assert reaper_.reap_orphans() >= 1
        assert _proc_state(orphan) is None  # reaped
        with pytest.raises(ChildProcessError):
            os.waitpid(orphan, os.WNOHANG)
        assert _proc_state(owned) == "Z"  # exec's own child: left for Popen.wait
    finally:
        reaper_.owned.discard(owned)
        os.waitpid(owned, 0)


def test_module_serve_discards_oversized_line() -> None:
    """A line over the limit is refused once, and its tail is not taken for a request."""
    agent_obj = server.Agent([])
    agent_obj.max_line = 16
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    serving = threading.Thread(target=agent_obj.serve, args=(req_r, rep_w, True), daemon=True)
    serving.start()
    try:
        # Two writes, so the agent sees the oversized line before its newline.
        os.write(req_w, b'{"id": 1, "action": "ping", "pad": "' + b"x" * 64)
        time.sleep(0.2)
        os.write(req_w, b'"}\n{"id":2,"action":"ping"}\n')
        os.close(req_w)
        serving.join(timeout=REPLY_TIMEOUT)
        assert not serving.is_alive()
        os.close(rep_w)
        with os.fdopen(rep_r, "rb") as f:
            replies = [json.loads(line) for line in f]
    finally:
        os.close(req_r)
    assert replies[0] == {"id": None, "ok": False, "error": "request too large"}
    assert [r["id"] for r in replies[1:]] == [2]
