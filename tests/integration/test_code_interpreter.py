"""Cells on real Jupyter kernels in real sandboxes (the code-interpreter image), through a real daemon.

One daemon and one template of the ``code-interpreter`` image for the module:
the template warms its IPython kernel before the snapshot, so every child
starts with a live kernel (forkd's bash and JavaScript kernels, and IRkernel
for R, start on their first cell). The image is built here if missing (cached by its recipe, like
the default image: instant when nothing changed, minutes the first time).
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from forkd.config import DataDir
from forkd.image.builder import build_image, recipe_for
from forkd.sdk import Controller, ExecutionError, Result, Sandbox

from .conftest import images_dir
from .daemon_fixture import FORKD, Daemon, SharedDaemons
from .test_ways_in import BROWSER_TEST, CHROMIUM, distinct_colours, png_pixels

pytestmark = pytest.mark.vm

IMAGE = "code-interpreter"
TAG = "code-interpreter-v1"  # the template E2B's code interpreter SDK asks for
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def daemon(shared_daemons: SharedDaemons) -> Iterator[Daemon]:
    """The session's shared daemon, with the code-interpreter template (boot + kernel warm-up)."""
    build_image(DataDir(Path("/nonexistent"), images_dir()), recipe_for(IMAGE))
    with shared_daemons.lend() as d:
        shared_daemons.template(d, TAG, image=IMAGE, boot_wait_secs=300, mem_mib=1024)
        yield d


@pytest.fixture
def http(daemon: Daemon) -> Iterator[httpx.Client]:
    with daemon.client(timeout=300) as client:
        yield client


def spawn(http: httpx.Client) -> str:
    r = http.post("/v1/sandboxes", json={"snapshot_tag": TAG})
    assert r.status_code == 201, r.text
    return str(r.json()[0]["id"])


@pytest.fixture
def sandbox(http: httpx.Client) -> Iterator[str]:
    sandbox_id = spawn(http)
    yield sandbox_id
    http.delete(f"/v1/sandboxes/{sandbox_id}")


def cell(http: httpx.Client, sandbox_id: str, code: str, **fields: Any) -> list[dict[str, Any]]:
    """A cell's events, each stamped with ``_at``: seconds since the request went out."""
    started = time.monotonic()
    events = []
    with http.stream("POST", f"/v1/sandboxes/{sandbox_id}/code", json={"code": code, **fields}) as r:
        assert r.status_code == 200, r.read().decode()
        for line in r.iter_lines():
            if line:
                events.append({**json.loads(line), "_at": time.monotonic() - started})
    assert events and events[-1]["type"] == "end", events
    return events


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


def stdout(events: list[dict[str, Any]]) -> str:
    return "".join(e["text"] for e in of_type(events, "stdout"))


def test_first_cell_and_warm_round_trip(http: httpx.Client, sandbox: str) -> None:
    first = cell(http, sandbox, "1 + 1")
    warm = min(cell(http, sandbox, "2 + 2")[-1]["_at"] for _ in range(5))
    print(f"\nfirst cell in a fresh child: {first[-1]['_at'] * 1000:.0f} ms; "
          f"warm cell round trip: {warm * 1000:.0f} ms")
    assert of_type(first, "result")[0]["data"]["text/plain"] == "2"
    assert of_type(first, "result")[0]["is_main_result"] is True
    # The kernel was started and warmed in the template: no kernel start here.
    assert first[-1]["_at"] < 30


def test_matplotlib_cell_returns_a_png(http: httpx.Client, sandbox: str) -> None:
    events = cell(http, sandbox, "import matplotlib.pyplot as plt\n"
                                 "plt.plot([1, 2, 3], [4, 1, 9])\nplt.title('t')\nplt.show()")
    pngs = [e["data"]["image/png"] for e in of_type(events, "result") if "image/png" in e["data"]]
    assert len(pngs) == 1, events
    png = base64.b64decode(pngs[0])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width > 100 and height > 100, (width, height)


def test_matplotlib_line_and_bar_plots_carry_their_chart_data(http: httpx.Client, sandbox: str) -> None:
    """Each shown figure: a PNG that decodes, and beside it E2B's chart data (``e2b/chart``,
    the SDK's ``Result.chart``) with the plotted values, from the image's e2b_charts."""
    events = cell(http, sandbox, "import matplotlib.pyplot as plt\n"
                                 "plt.plot([1, 2, 3], [4, 1, 9], label='sales')\nplt.title('Sales')\n"
                                 "plt.xlabel('day')\nplt.ylabel('units')\nplt.show()\n"
                                 "plt.bar(['a', 'b', 'c'], [3, 5, 2], label='stock')\nplt.title('Stock')\n"
                                 "plt.show()")
    assert not of_type(events, "error"), events
    line, bar = [e["data"] for e in of_type(events, "result")]
    for shown in (line, bar):
        png = base64.b64decode(shown["image/png"])
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert int.from_bytes(png[16:20], "big") > 100 and int.from_bytes(png[20:24], "big") > 100
    chart = line["e2b/chart"]
    assert [chart[k] for k in ("type", "title", "x_label", "y_label")] == ["line", "Sales", "day", "units"]
    assert [(e["label"], e["points"]) for e in chart["elements"]] == [("sales", [[1, 4], [2, 1], [3, 9]])]
    chart = bar["e2b/chart"]
    assert (chart["type"], chart["title"]) == ("bar", "Stock")
    assert [(e["label"], e["value"], e["group"]) for e in chart["elements"]] == [
        ("a", 3, "stock"), ("b", 5, "stock"), ("c", 2, "stock")]
    blank = cell(http, sandbox, "plt.subplots()\nplt.show()")  # axes, no data: the PNG alone, as in E2B
    (shown,) = [e["data"] for e in of_type(blank, "result")]
    assert "image/png" in shown and "e2b/chart" not in shown


def test_dataframe_returns_html(http: httpx.Client, sandbox: str) -> None:
    events = cell(http, sandbox, "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
    (result,) = of_type(events, "result")
    assert result["is_main_result"] is True
    assert "<table" in result["data"]["text/html"]
    assert "a" in result["data"]["text/plain"]
    assert result["data"]["e2b/data"] == {"a": [1, 2], "b": ["x", "y"]}  # E2B's `data` field


def test_error_has_name_value_and_traceback(http: httpx.Client, sandbox: str) -> None:
    events = cell(http, sandbox, "def f():\n    raise ValueError('boom')\nf()")
    (error,) = of_type(events, "error")
    assert (error["name"], error["value"]) == ("ValueError", "boom")
    plain = re.sub(r"\x1b\[[0-9;]*m", "", error["traceback"])  # IPython colours it
    assert "raise ValueError('boom')" in plain and "f()" in plain, plain


def test_sdk_run_code_calls_back_and_types_its_results(daemon: Daemon, sandbox: str) -> None:
    """``Sandbox.run_code``: the callbacks as the events come, typed results, the PNG, the error."""
    with Controller(daemon.url, daemon.token) as controller:
        sb = Sandbox(sandbox_id=sandbox, controller=controller)
        seen: list[tuple[str, Any]] = []
        execution = sb.run_code("import sys\nprint(6 * 7)\nprint('w', file=sys.stderr)\n6 * 7",
                                on_stdout=lambda text: seen.append(("stdout", text)),
                                on_stderr=lambda text: seen.append(("stderr", text)))
        assert seen == [("stdout", "42\n"), ("stderr", "w\n")], seen
        assert execution.logs.stdout == ["42\n"] and execution.text == "42" and execution.error is None
        results: list[Result] = []
        figure = sb.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 1, 9])\nplt.show()",
                             on_result=results.append)
        assert results == figure.results and len(results) == 1, figure
        assert not results[0].is_main_result and figure.text is None
        assert base64.b64decode(results[0].png or "")[:8] == b"\x89PNG\r\n\x1a\n"
        assert results[0].chart and results[0].chart["type"] == "line", results[0].chart
        errors: list[ExecutionError] = []
        failed = sb.run_code("1 / 0", on_error=errors.append)
        assert failed.error is not None and failed.error.name == "ZeroDivisionError", failed
        assert errors == [failed.error] and "division by zero" in failed.error.value


def test_output_streams_before_the_cell_ends(http: httpx.Client, sandbox: str) -> None:
    events = cell(http, sandbox, "import time\nprint('one', flush=True)\ntime.sleep(2)\nprint('two')")
    assert stdout(events) == "one\ntwo\n"
    first = of_type(events, "stdout")[0]
    assert "one" in first["text"]
    assert events[-1]["_at"] - first["_at"] > 1.5, events


def test_timeout_interrupts_and_the_kernel_is_usable_at_once(http: httpx.Client, sandbox: str) -> None:
    cell(http, sandbox, "x = 41")
    events = cell(http, sandbox, "while True: pass", timeout=2)
    assert events[-1]["timed_out"] is True and events[-1]["restarted"] is False, events
    assert of_type(events, "error")[0]["name"] == "KeyboardInterrupt"
    after = cell(http, sandbox, "x + 1")
    assert of_type(after, "result")[0]["data"]["text/plain"] == "42"  # same kernel, state kept
    assert after[-1]["_at"] < 5


def test_a_client_that_leaves_interrupts_the_cell(http: httpx.Client, sandbox: str) -> None:
    with http.stream("POST", f"/v1/sandboxes/{sandbox}/code",
                     json={"code": "import time\nprint('go', flush=True)\nwhile True: time.sleep(0.1)"}) as r:
        for line in r.iter_lines():
            if line and json.loads(line)["type"] == "stdout":
                break  # leave mid-cell
    time.sleep(1)
    after = cell(http, sandbox, "'free'")
    assert of_type(after, "result")[0]["data"]["text/plain"] == "'free'"
    assert after[-1]["_at"] < 10


def test_forked_children_continue_one_kernel_session(http: httpx.Client, sandbox: str) -> None:
    cell(http, sandbox, "import pandas as pd, random\ndf = pd.DataFrame({'v': [1, 2, 3]})\n"
                        "secret = 'before-fork'")
    r = http.post(f"/v1/sandboxes/{sandbox}/fork", json={"count": 2})
    assert r.status_code in (200, 201), r.text
    children = [c["id"] for c in r.json()["children"]]
    assert len(children) == 2, r.text
    try:
        for i, child in enumerate(children):
            code = f"df['v'] = df['v'] * {10 ** (i + 1)}\nprint(secret)\nint(df['v'].sum())"
            events = cell(http, child, code)
            assert stdout(events) == "before-fork\n", events
            assert of_type(events, "result")[0]["data"]["text/plain"] == str(6 * 10 ** (i + 1))
        # Each child went its own way; the parent kept its own state.
        for i, child in enumerate(children):
            events = cell(http, child, "int(df['v'].sum())")
            assert of_type(events, "result")[0]["data"]["text/plain"] == str(6 * 10 ** (i + 1))
        events = cell(http, sandbox, "int(df['v'].sum())")
        assert of_type(events, "result")[0]["data"]["text/plain"] == "6"
        # Each child's kernel was reseeded at its restore: siblings draw different numbers.
        draws = {of_type(cell(http, child, "random.random()"), "result")[0]["data"]["text/plain"]
                 for child in children}
        assert len(draws) == 2, draws
    finally:
        for child in children:
            http.delete(f"/v1/sandboxes/{child}")


def errors(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["name"], e["value"]) for e in of_type(events, "error")]


def text(events: list[dict[str, Any]]) -> str:
    return str(of_type(events, "result")[0]["data"]["text/plain"])


def test_bash_cells_stream_and_keep_their_shell(http: httpx.Client, sandbox: str) -> None:
    events = cell(http, sandbox, "echo one; sleep 2; echo two", language="bash")
    assert stdout(events) == "one\ntwo\n" and errors(events) == [], events
    assert events[-1]["_at"] - of_type(events, "stdout")[0]["_at"] > 1.5, events  # "one" came first
    cell(http, sandbox, "greeting=hello; cd /tmp", language="bash")
    assert stdout(cell(http, sandbox, "echo $greeting; pwd", language="bash")) == "hello\n/tmp\n"
    assert errors(cell(http, sandbox, "ls /nowhere", language="bash")) == [("", "2")]  # E2B's shape
    # Process substitution reads /dev/fd, which the agent links as an init would.
    assert stdout(cell(http, sandbox, "cat <(echo substituted)", language="bash")) == "substituted\n"
    # A cell in another language than its context's: refused by the guest, in the stream's end.
    (refused,) = cell(http, sandbox, "1", context="default-bash", language="python")
    assert refused["type"] == "end" and "runs bash, not python" in refused["error"], refused


def test_javascript_cells_return_values_and_keep_declarations(http: httpx.Client, sandbox: str) -> None:
    events = cell(http, sandbox, "console.log('hi'); 1 + 1", language="javascript")
    assert stdout(events) == "hi\n" and text(events) == "2", events
    cell(http, sandbox, "let kept = 40", language="js")
    assert text(cell(http, sandbox, "kept + 2", language="js")) == "42"
    assert text(cell(http, sandbox, "await Promise.resolve(process.cwd())", language="js")) == "'/home/user'"
    (error,) = of_type(cell(http, sandbox, "null.x", language="js"), "error")
    assert error["name"] == "TypeError" and "null" in error["value"], error


def test_an_interrupted_javascript_loop_leaves_its_kernel_usable(http: httpx.Client, sandbox: str) -> None:
    cell(http, sandbox, "const survivor = 7", language="js")
    events = cell(http, sandbox, "while (true) {}", language="js", timeout=3)
    assert events[-1]["timed_out"] is True and events[-1]["restarted"] is False, events
    assert "SIGINT" in errors(events)[0][1], events
    after = cell(http, sandbox, "survivor * 6", language="js")
    assert text(after) == "42" and after[-1]["_at"] < 10, after  # the same context, at once


def test_r_cells_print_return_values_take_env_and_start_in_home(http: httpx.Client, sandbox: str) -> None:
    first = cell(http, sandbox, 'print("Hello, World!")', language="r")  # IRkernel starts here
    print(f"\nfirst R cell (IRkernel starts): {first[-1]['_at']:.1f}s")
    assert stdout(first) == '[1] "Hello, World!"\n' and errors(first) == [], first
    cell(http, sandbox, "kept <- 40", language="r")
    assert text(cell(http, sandbox, "kept + 2", language="r")) == "[1] 42"
    odd = 'say "hi" \\ \t done\n'  # R's string escapes are JSON's
    events = cell(http, sandbox, "cat(Sys.getenv('ODD')); Sys.getenv('FOO')", language="r",
                  env={"FOO": "bar", "ODD": odd})
    assert text(events) == '[1] "bar"' and stdout(events) == odd, events
    after = cell(http, sandbox, "Sys.getenv('FOO', unset = 'default')", language="r")
    assert text(after) == '[1] "default"', after  # the cell's env alone
    assert text(cell(http, sandbox, "getwd()", language="r")) == '[1] "/home/user"'
    (error,) = of_type(cell(http, sandbox, 'stop("boom")', language="r"), "error")
    assert error["name"] == "ERROR" and error["value"] == "Error in eval(expr, envir, enclos): boom\n", error
    assert text(cell(http, sandbox, "ls()", language="r")) == '[1] "kept"'  # nothing of forkd's left


def test_forked_children_continue_one_r_session_each_reseeded(http: httpx.Client, sandbox: str) -> None:
    cell(http, sandbox, "kept <- 'before-fork'; set.seed(1)", language="r")
    r = http.post(f"/v1/sandboxes/{sandbox}/fork", json={"count": 2})
    assert r.status_code in (200, 201), r.text
    children = [c["id"] for c in r.json()["children"]]
    try:
        draws = set()
        for child in children:
            events = cell(http, child, "cat(kept); runif(1)", language="r")
            assert stdout(events) == "before-fork" and errors(events) == [], events
            draws.add(text(events))
        assert len(draws) == 2, draws  # each child's R was seeded anew at its restore
    finally:
        for child in children:
            http.delete(f"/v1/sandboxes/{child}")


def test_e2b_code_interpreter_sdk_runs_unchanged(daemon: Daemon) -> None:
    """The published e2b_code_interpreter SDK (.venv-clients, made by `make clients`)."""
    python = ROOT / ".venv-clients" / "bin" / "python"
    if not python.exists():
        pytest.skip("no .venv-clients: make clients")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FORKD_", "E2B_"))}
    env.update({"E2B_API_URL": daemon.url, "E2B_SANDBOX_URL": daemon.url, "E2B_API_KEY": daemon.token})
    proc = subprocess.run([str(python), str(ROOT / "tests" / "clients" / "e2b" / "kernel.py")], env=env,
                          capture_output=True, text=True, timeout=600, cwd="/tmp")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("kernel ok"), (
        f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-8000:]}")
    with daemon.client() as http:
        assert http.get("/v1/sandboxes").json() == []


PLOT = ("import matplotlib.pyplot as plt\nprint('forkd-' + str(6 * 7))\n"
        "plt.plot([1, 2, 3], [4, 1, 9], color='tab:red')\nplt.title('t')\nplt.show()")


def forkd_env(daemon: Daemon) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORKD_")}
    return env | {"FORKD_URL": daemon.url, "FORKD_TOKEN": daemon.token}


def test_mcp_run_code_over_stdio_returns_the_plot_as_an_image(daemon: Daemon, sandbox: str) -> None:
    """An MCP client starts `forkd mcp` and calls run_code: the print comes back as text, the
    matplotlib figure as an image block, and a raised exception as its name and value."""
    import asyncio

    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=str(FORKD), args=["mcp"], env=forkd_env(daemon))

    async def run() -> tuple[Any, Any]:
        async with Client(params) as client:
            plot = await client.call_tool("run_code", {"sandbox_id": sandbox, "code": PLOT})
            failing = await client.call_tool("run_code", {"sandbox_id": sandbox, "code": "1 / 0"})
            return plot, failing

    plot, failing = asyncio.run(asyncio.wait_for(run(), 600))
    assert not plot.is_error, plot.content
    texts = [b.text for b in plot.content if b.type == "text"]
    images = [b for b in plot.content if b.type == "image"]
    assert any("forkd-42" in t for t in texts), texts
    assert len(images) == 1 and images[0].mime_type == "image/png", plot.content
    png = base64.b64decode(images[0].data)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot.structured_content["stdout"] == "forkd-42\n" and plot.structured_content["images"] == 1
    assert "ZeroDivisionError" in failing.content[0].text, failing.content
    assert failing.structured_content["error"]["name"] == "ZeroDivisionError"


def test_a_cell_in_the_web_console_shows_its_print_and_its_plot(daemon: Daemon, sandbox: str,
                                                                 tmp_path: Path) -> None:
    """The console's Code panel in headless Chromium: a matplotlib cell's print as text and its
    figure as a loaded PNG <img>; the token never in a URL."""
    assert CHROMIUM.exists(), "chromium is not installed; scripts/install-deps.sh installs it"
    env = forkd_env(daemon) | {"OUT_DIR": str(tmp_path), "SANDBOX": sandbox, "CHROMIUM": str(CHROMIUM)}
    started = time.monotonic()
    out = subprocess.run(["node", "cell.mjs"], cwd=BROWSER_TEST, env=env, capture_output=True, text=True,
                         timeout=300)
    print(f"\nheadless chromium code cell: {time.monotonic() - started:.1f} s")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-8000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert "forkd-42" in seen["stdout"] and seen["status"].startswith("done"), seen
    assert seen["image"]["naturalWidth"] > 100 and seen["image"]["naturalHeight"] > 100, seen["image"]
    assert seen["image"]["src"].startswith("data:image/png;base64,") and not seen["tokenInUrl"]
    errors = [line for line in seen["console"] if line.startswith("error") and "status of 401" not in line]
    assert not errors, seen["console"]
    width, height, _ = png_pixels(tmp_path / "cell.png")
    assert width >= 300 and height >= 300
    assert distinct_colours(tmp_path / "cell.png") > 4  # the plot's red line among the page's greys


def test_typescript_sdk_run_code_on_the_kernel_template(daemon: Daemon) -> None:
    """The TypeScript SDK's runCode (sdk/typescript/test/processes.test.ts, "code cells") on this
    module's kernel template: output through the callback, the text, a PNG, an error's name."""
    ts = ROOT / "sdk" / "typescript"
    assert (ts / "node_modules").is_dir(), "run `make node-deps` (npm ci) first; `make test` does"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORKD_")}
    env.update(FORKD_URL=daemon.url, FORKD_TOKEN=daemon.token, FORKD_TEST_TAG=TAG, FORKD_TEST_CODE_TAG=TAG)
    for script in ("build", "build:test"):
        built = subprocess.run(["npm", "run", "--silent", script], cwd=ts, capture_output=True, text=True,
                               timeout=300)
        assert built.returncode == 0, built.stdout + built.stderr
    out = subprocess.run(["node", "--experimental-websocket", "--test", "--test-name-pattern", "code cells",
                          "build/test/processes.test.js"], cwd=ts, env=env, capture_output=True, text=True,
                         timeout=600)
    report = out.stdout + out.stderr
    assert out.returncode == 0 and "# fail 0" in report, report[-4000:]
    assert re.search(r"^# pass [1-9]", report, re.M), report[-4000:]
