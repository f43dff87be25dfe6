"""forkd's bash and JavaScript kernels, for real on this host, without a VM.

The wrapper kernels (``guest/agent/kernel_bash.py``, ``kernel_js.py``) are
started by a real ``jupyter_client.KernelManager`` from the kernel.json files
the runner writes (``kernel_specs``), and cells run on them: output streams,
state persists, errors come back with their names, an interrupt leaves the
kernel usable, and a cell's environment reaches it alone. Then the runner
(``kernel_runner.py``) with a language per context, the agent's choice of a
cell's language and context, and the language names of the API and the E2B
layer. Needs the dev extra's jupyter-client and ipykernel (the guest has
Debian's) and, for JavaScript, ``node`` on the PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
from fastapi.testclient import TestClient
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from forkd.api.code_routes import CodeRequest, KernelLanguage
from forkd.api.e2b.interpreter import Interpreter
from forkd.errors import ForkdError
from forkd.guest import code_messages
from forkd.guest.agent import kernel_r, kernel_specs
from forkd.guest.agent import kernels as agent_kernels
from forkd.guest.agent.channel import Channel
from forkd.guest.agent.contexts import CodeContexts
from forkd.guest.agent.evaluator import Evaluator
from forkd.guest.agent.reaper import Reaper
from forkd.guest.protocol import INVALID, RequestError

AGENT = Path(kernel_specs.__file__).parent
NO_JUPYTER = "needs jupyter-client and ipykernel (pip install -c constraints.txt -e '.[dev]')"
jupyter = pytest.mark.skipif(not kernel_specs.jupyter(), reason=NO_JUPYTER)
NO_NODE = "needs node on the PATH (apt-get install nodejs)"
node = pytest.mark.skipif(shutil.which("node") is None, reason=NO_NODE)


# ---------------------------------------------------------------------------- names


def test_the_api_names_the_languages_the_protocol_has() -> None:
    assert set(get_args(KernelLanguage)) == {*code_messages.KERNEL_LANGUAGES,
                                             *code_messages.KERNEL_LANGUAGE_ALIASES}
    assert CodeRequest(code="1").language is None


@pytest.mark.parametrize(("name", "language"), [(None, "python"), ("", "python"), ("Python", "python"),
                                                ("js", "javascript"), (" JavaScript ", "javascript"),
                                                ("bash", "bash"), ("r", "r"), ("R", "r")])
def test_a_language_by_any_of_its_names(name: object, language: str) -> None:
    assert code_messages.kernel_language(name) == language


def test_an_unknown_language_is_refused_naming_those_served() -> None:
    with pytest.raises(RequestError, match="python, bash, javascript, r") as exc:
        code_messages.kernel_language("typescript")
    assert exc.value.kind == INVALID
    assert code_messages.default_context("python") == "default"
    assert code_messages.default_context("bash") == "default-bash"
    assert code_messages.default_context("r") == "default-r"


# ---------------------------------------------------------------- R (IRkernel)


def test_r_runs_on_irkernel_where_the_image_has_r(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = kernel_specs.write(str(tmp_path), python="/usr/bin/python3")
    spec = json.loads((Path(folder) / kernel_specs.KERNEL_NAMES["r"] / "kernel.json").read_text())
    assert spec["argv"] == ["R", "--slave", "-e", "IRkernel::main()", "--args", "{connection_file}"]
    assert spec["language"] == "R" and spec["interrupt_mode"] == "signal"
    bash = json.loads((Path(folder) / "forkd-bash" / "kernel.json").read_text())
    assert bash["argv"][:2] == ["/usr/bin/python3", str(AGENT / "kernel_bash.py")]
    on_path = {"bash", "R"}
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}" if name in on_path else None)
    assert kernel_specs.languages(True) == ("python", "bash", "r")
    assert kernel_specs.languages(False) == ()
    monkeypatch.setattr(kernel_specs, "jupyter", lambda: True)
    assert "no R for r kernels" in kernel_specs.missing("r")


def test_rs_silent_cells_quote_names_and_values_as_r_strings() -> None:
    env = {"FOO": "bar", "ODD": 'say "hi" \\ \t\n ü'}
    code = kernel_r.env_in(env)
    assert code.startswith("invisible(local({") and code.endswith("}))")
    # JSON's escapes without ensure_ascii, which R reads alike: no \u escape of a printable character
    assert r'c("bar", "say \"hi\" \\ \t\n ü")' in code and 'c("FOO", "ODD")' in code
    assert "Sys.getenv(c(\"FOO\", \"ODD\"), unset = NA, names = TRUE)" in code
    assert "'.forkd_saved'" in code and "'.forkd_saved'" in kernel_r.ENV_OUT  # hidden from ls()
    assert "Sys.unsetenv" in kernel_r.ENV_OUT
    seeded = kernel_r.restored({"CHILD": "c1"}, b"\xff" * 16)
    seed = int(seeded.split("set.seed(")[1].split(")")[0])
    assert 0 <= seed < 2**31 - 1 and 'c("CHILD")' in seeded
    assert kernel_r.restored({}, bytes(16)) == "invisible(local({set.seed(0)}))"


# ------------------------------------------------------------------ the kernels


# jupyter_client's blocking client applies nest_asyncio, which swaps asyncio's tasks, futures and
# asyncio.run for its own in the whole process: the rest of the unit tests (test_sdk's per-loop
# controllers) then fail. So the client runs in a child interpreter, driven over its stdin/stdout.
_CLIENT = r"""
import json, queue, sys, time
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from forkd.guest.agent import kernel_r, kernel_specs

language, cwd = sys.argv[1], sys.argv[2]
specs = KernelSpecManager(kernel_dirs=[kernel_specs.write(cwd + "/.specs")], ensure_native_kernel=False)
km = KernelManager(kernel_name=kernel_specs.KERNEL_NAMES[language], kernel_spec_manager=specs)
km.start_kernel(cwd=cwd)
kc = km.blocking_client()
kc.start_channels()
kc.wait_for_ready(timeout=60)
print(json.dumps("ready"), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    metadata = {"forkd_env": req["env"]} if req["env"] else {}
    msg = kc.session.msg("execute_request", {"code": req["code"], "silent": False, "store_history": True,
                                             "user_expressions": {}, "allow_stdin": False}, metadata=metadata)
    kc.shell_channel.send(msg)
    interrupt_after, started, out, ended = req["interrupt_after"], time.monotonic(), [], False
    running_since = None  # the cell's execute_input: an interrupt before it would find nothing to stop
    while time.monotonic() - started < 30:
        # Interrupted that long after the cell began, and again every 2 s until it ends: on a loaded
        # host the first signal may come while the wrapper is still handing the cell over.
        if interrupt_after is not None and running_since is not None and \
                time.monotonic() - running_since > interrupt_after:
            km.interrupt_kernel()
            running_since += 2
        try:
            got = kc.get_iopub_msg(timeout=0.1)
        except queue.Empty:
            continue
        if got["parent_header"].get("msg_id") != msg["header"]["msg_id"]:
            continue
        if got["msg_type"] == "status" and got["content"]["execution_state"] == "idle":
            ended = True
            break
        if got["msg_type"] == "execute_input" and running_since is None:
            running_since = time.monotonic()
        out.append({"type": got["msg_type"], "at": time.monotonic(), **got["content"]})
    print(json.dumps({"ended": ended, "messages": out}, default=str), flush=True)
kc.stop_channels()
km.shutdown_kernel(now=True)
"""


class Kernel:
    """A wrapper kernel under a real KernelManager (in a child interpreter), from the runner's
    kernel.json files."""

    def __init__(self, language: str, cwd: Path) -> None:
        self.cwd = cwd
        self.proc = subprocess.Popen([sys.executable, "-c", _CLIENT, language, str(cwd)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self._answer() == "ready"

    def _answer(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the Jupyter client exited ({self.proc.poll()})"
        return json.loads(line)

    def run(self, code: str, env: dict[str, str] | None = None,
            interrupt_after: float | None = None) -> list[dict[str, Any]]:
        """One cell's iopub messages (type, content, arrival time), up to its idle."""
        assert self.proc.stdin is not None
        request = {"code": code, "env": env, "interrupt_after": interrupt_after}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self._answer()
        if not answer["ended"]:
            raise AssertionError(f"the cell did not end: {answer['messages']}")
        return list(answer["messages"])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def stdout(messages: list[dict[str, Any]]) -> str:
    return "".join(m["text"] for m in messages if m["type"] == "stream" and m["name"] == "stdout")


def result(messages: list[dict[str, Any]]) -> str | None:
    found = [m["data"]["text/plain"] for m in messages if m["type"] == "execute_result"]
    return found[-1] if found else None


def errors(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["ename"], m["evalue"]) for m in messages if m["type"] == "error"]


@pytest.fixture(scope="module")
def bash(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    if not kernel_specs.jupyter():
        pytest.skip(NO_JUPYTER)
    kernel = Kernel("bash", tmp_path_factory.mktemp("bash"))
    yield kernel
    kernel.close()


@pytest.fixture(scope="module")
def js(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    if not kernel_specs.jupyter():
        pytest.skip(NO_JUPYTER)
    if shutil.which("node") is None:
        pytest.skip(NO_NODE)
    kernel = Kernel("javascript", tmp_path_factory.mktemp("js"))
    yield kernel
    kernel.close()


def test_bash_streams_output_while_the_cell_runs(bash: Kernel) -> None:
    out = bash.run("echo one; sleep 0.6; echo two >&2; echo three")
    streams = [(m["name"], m["text"]) for m in out if m["type"] == "stream"]  # two pipes: no order
    assert sorted(streams) == [("stderr", "two\n"), ("stdout", "one\n"), ("stdout", "three\n")], streams
    assert stdout(out) == "one\nthree\n" and streams[0] == ("stdout", "one\n")
    assert out[-1]["at"] - out[0]["at"] > 0.4  # the first line came before the sleep ended


def test_bash_keeps_variables_functions_and_cwd(bash: Kernel) -> None:
    bash.run("x=41; greet() { echo \"hi $1\"; }; cd /")
    assert stdout(bash.run("echo $((x + 1)); greet you; pwd")) == "42\nhi you\n/\n"


def test_bash_reports_a_failed_last_command_as_e2bs_bash_kernel_does(bash: Kernel) -> None:
    assert errors(bash.run("true; (exit 3)")) == [("", "3")]
    assert errors(bash.run("false; true")) == []
    assert errors(bash.run("if then")) == [("", "2")]  # a syntax error fails the cell alone
    assert stdout(bash.run("echo still here")) == "still here\n"


def test_bash_interrupt_stops_the_command_and_keeps_the_shell(bash: Kernel) -> None:
    bash.run("kept=yes")
    started = time.monotonic()
    out = bash.run("while true; do sleep 0.1; done", interrupt_after=0.5)
    assert time.monotonic() - started < 5 and errors(out) == [("", "130")]
    assert stdout(bash.run("echo $kept")) == "yes\n"


def test_bash_env_is_the_cells_alone(bash: Kernel) -> None:
    assert stdout(bash.run("echo $FOO; sh -c 'echo $FOO'", env={"FOO": "bar"})) == "bar\nbar\n"
    assert stdout(bash.run("echo ${FOO:-default}")) == "default\n"


def test_bash_that_exits_is_started_anew_and_says_so(bash: Kernel) -> None:
    (name, value), = errors(bash.run("exit 4"))
    assert name == "KernelRestarted" and "exited" in value, value
    assert stdout(bash.run("echo back")) == "back\n"


def test_javascript_prints_returns_and_keeps_declarations(js: Kernel) -> None:
    out = js.run("console.log('Hello, World!'); 1 + 1")
    assert stdout(out) == "Hello, World!\n" and result(out) == "2"
    assert result(js.run("let x = 1; const add = (a, b) => a + b; function twice(v) { return 2 * v }")) \
        is None
    assert result(js.run("twice(add(x, 2))")) == "6"
    assert result(js.run("process.cwd()")) == f"'{js.cwd}'"


def test_javascript_top_level_await_and_imports(js: Kernel) -> None:
    assert result(js.run("async function main() { return 'Hello' }\nawait main()")) == "'Hello'"
    assert result(js.run("const v = await Promise.resolve(20)")) is None
    assert result(js.run("v + 1")) == "21"
    imported = js.run("import { readFileSync } from 'fs'\nconsole.log(typeof readFileSync)")
    assert stdout(imported) == "function\n"


def test_javascript_errors_come_back_with_name_value_and_stack(js: Kernel) -> None:
    out = js.run("function boom() { throw new RangeError('too far') }\nboom()")
    (error,) = [m for m in out if m["type"] == "error"]
    assert (error["ename"], error["evalue"]) == ("RangeError", "too far")
    assert any("boom" in line for line in error["traceback"])
    assert errors(js.run("let = ;"))[0][0] == "SyntaxError"


def test_javascript_interrupt_stops_a_busy_loop_and_keeps_the_context(js: Kernel) -> None:
    js.run("let survivor = 7")
    out = js.run("while (true) {}", interrupt_after=0.5)
    assert errors(out) and "SIGINT" in errors(out)[0][1]
    assert result(js.run("survivor")) == "7"
    out = js.run("await new Promise(() => {})", interrupt_after=0.5)  # a pending await is abandoned
    assert "SIGINT" in errors(out)[0][1] and result(js.run("survivor + 1")) == "8"


def test_javascript_env_is_the_cells_alone(js: Kernel) -> None:
    assert result(js.run("process.env.FOO", env={"FOO": "bar"})) == "'bar'"
    assert result(js.run("process.env.FOO || 'default'")) == "'default'"


# ---------------------------------------------------------------- the runner


@jupyter
@node
def test_the_runner_starts_each_contexts_kernel_in_its_language(tmp_path: Path) -> None:
    runner = subprocess.Popen([sys.executable, "-u", str(AGENT / "kernel_runner.py")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert runner.stdin is not None and runner.stdout is not None

    def ask(req: dict[str, Any]) -> list[dict[str, Any]]:
        runner.stdin.write(json.dumps(req) + "\n")  # type: ignore[union-attr]
        runner.stdin.flush()  # type: ignore[union-attr]
        answers = []
        while "id" in req and (not answers or answers[-1]["type"] != "end"):
            answers.append(json.loads(runner.stdout.readline()))  # type: ignore[union-attr]
        return answers

    try:
        first = ask({"id": 1, "op": "run", "context": "b", "language": "bash", "code": "echo $FOO; X=1",
                     "env": {"FOO": "bar"}, "cwd": str(tmp_path)})
        assert first[0] == {"id": 1, "type": "stdout", "text": "bar\n"}
        js = ask({"id": 2, "op": "run", "context": "j", "language": "javascript", "code": "process.cwd()",
                  "cwd": str(tmp_path)})
        assert js[0]["data"] == {"text/plain": f"'{tmp_path}'"}
        wrong = ask({"id": 3, "op": "run", "context": "b", "language": "javascript", "code": "1"})
        assert wrong[0]["type"] == "error" and "runs bash" in wrong[0]["value"]
        ask({"op": "restored", "env": {"CHILD": "c1"}})  # a restored child's environment, in every kernel
        assert ask({"id": 4, "op": "run", "context": "b", "language": "bash",
                    "code": "echo $X $CHILD"})[0]["text"] == "1 c1\n"
        assert ask({"id": 5, "op": "run", "context": "j", "language": "javascript",
                    "code": "process.env.CHILD"})[0]["data"] == {"text/plain": "'c1'"}
    finally:
        runner.kill()
        runner.wait()


# ---------------------------------------------------------------- the agent


def test_the_agent_settles_a_cells_language_context_and_cwd(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(code_messages, "KERNEL_HOME", str(tmp_path))
    warm: dict[str, Any] = {}
    contexts = CodeContexts(warm, Evaluator(warm), lambda: ("python", "bash", "javascript"))
    listed = contexts.handle({"op": "list"})["contexts"]
    assert [(c["id"], c["language"], c["cwd"]) for c in listed] == [
        ("default", "python", str(tmp_path)), ("default-bash", "bash", str(tmp_path)),
        ("default-javascript", "javascript", str(tmp_path))]
    made = contexts.handle({"op": "create", "language": "js", "cwd": "/tmp"})
    assert made["language"] == "javascript" and contexts.handle({"op": "list"})["contexts"][-1] == made
    with pytest.raises(RequestError, match="Jupyter kernel"):  # PID 1 runs Python only
        contexts.handle({"op": "run", "code": "1", "context": made["id"]})
    with pytest.raises(RequestError, match="cannot be removed"):
        contexts.handle({"op": "remove", "context": "default-bash"})
    with pytest.raises(RequestError, match="code-interpreter"):
        CodeContexts(warm, Evaluator(warm)).handle({"op": "create", "language": "bash"})

    kernels = agent_kernels.Kernels(Channel(), Reaper(), contexts)
    kernels._available = True
    monkeypatch.setattr(kernel_specs, "jupyter", lambda: True)
    monkeypatch.setattr(kernel_specs, "languages", lambda _jupyter=None: ("python", "bash", "javascript"))
    assert kernels._settle("default-bash", None, None) == ("bash", str(tmp_path))
    assert kernels._settle(made["id"], "javascript", None) == ("javascript", "/tmp")
    assert kernels._settle("adhoc", None, "/srv") == ("python", "/srv")
    with pytest.raises(RequestError, match="runs javascript, not python") as exc:
        kernels._settle(made["id"], "python", None)
    assert exc.value.kind == INVALID
    kernels.languages["adhoc"] = "bash"  # a kernel started without a made context keeps its language
    assert kernels._settle("adhoc", None, None) == ("bash", str(tmp_path))
    monkeypatch.setattr(kernel_specs, "languages", lambda _jupyter=None: ("python", "bash"))
    with pytest.raises(RequestError, match="no node"):
        kernels._settle("default-javascript", None, None)


# ---------------------------------------------------------------- E2B's interpreter


class _Cell:
    def __init__(self) -> None:
        self.events = [{"type": "end", "execution_count": 1, "timed_out": False, "restarted": False}]

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._gen()

    async def _gen(self) -> AsyncIterator[dict[str, Any]]:
        for event in self.events:
            yield event

    async def aclose(self) -> None:
        pass


class _Runtime:
    """The parts of the Runtime the interpreter calls, recording the kernel runs and creates."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.kernels, self.code = self, self

    async def available(self, sandbox_id: str) -> bool:
        return True

    async def run(self, sandbox_id: str, code: str, **kw: Any) -> _Cell:
        self.calls.append(("run", kw))
        return _Cell()

    async def create(self, sandbox_id: str, **kw: Any) -> dict[str, str]:
        self.calls.append(("create", kw))
        return {"id": "c1", "language": kw.get("language") or "python", "cwd": kw.get("cwd") or "/"}

    async def list(self, sandbox_id: str) -> list[dict[str, str]]:
        return [{"id": "c1", "language": "bash", "cwd": "/srv"}]


@pytest.fixture
def e2b() -> Iterator[tuple[TestClient, _Runtime]]:
    rt = _Runtime()
    interpreter = Interpreter(lambda: rt)  # type: ignore[arg-type, return-value]

    async def route(request: Request) -> Response:
        try:
            return await interpreter.handle(request, "sb-1")
        except ForkdError as exc:
            return JSONResponse({"message": str(exc)}, status_code=exc.status)

    app = Starlette(routes=[Route("/{path:path}", route, methods=["GET", "POST", "DELETE"])])
    with TestClient(app) as client:
        yield client, rt


def test_e2b_execute_passes_the_language_on(e2b: tuple[TestClient, _Runtime]) -> None:
    client, rt = e2b
    assert client.post("/execute", json={"code": "echo hi", "language": "bash"}).status_code == 200
    assert client.post("/execute", json={"code": "1", "language": "js"}).status_code == 200
    assert client.post("/execute", json={"code": "1", "context_id": "c1"}).status_code == 200
    assert client.post("/execute", json={"code": "1", "language": "R"}).status_code == 200
    assert [(kw["language"], kw["context"], kw["cwd"]) for _, kw in rt.calls] == [
        ("bash", None, None), ("javascript", None, None), (None, "c1", "/srv"), ("r", None, None)]


@pytest.mark.parametrize(("body", "says"), [
    ({"code": "1", "language": "java"}, "python, bash, javascript, r"),
    ({"code": "1", "language": "js", "context_id": "c1"}, "Only one of context_id or language"),
])
def test_e2b_refuses_what_it_cannot_run(e2b: tuple[TestClient, _Runtime], body: dict[str, Any],
                                        says: str) -> None:
    client, rt = e2b
    resp = client.post("/execute", json=body)
    assert resp.status_code == 400 and says in resp.json()["message"], resp.text
    assert rt.calls == []


def test_e2b_contexts_start_in_home_user_unless_told(e2b: tuple[TestClient, _Runtime]) -> None:
    client, rt = e2b
    made = client.post("/contexts", json={"language": "javascript"}).json()
    assert made["cwd"] == code_messages.KERNEL_HOME
    assert client.post("/contexts", json={"language": "bash", "cwd": "/tmp"}).json()["cwd"] == "/tmp"
    assert rt.calls == [("create", {"language": "javascript", "cwd": code_messages.KERNEL_HOME}),
                        ("create", {"language": "bash", "cwd": "/tmp"})]
    assert client.post("/contexts", json={"language": "ruby"}).status_code == 400


def test_kernel_files_ship_with_the_agent() -> None:
    for script in (*kernel_specs.SCRIPTS.values(), "kernel_js_driver.js"):
        assert (AGENT / script).is_file()
    assert os.access(AGENT / "kernel_runner.py", os.R_OK)
