"""The agent's code contexts (``context`` action) and ``file_move``, called in-process.

The real agent serves them in every VM (tests/integration/test_e2b.py runs the
E2B code interpreter against it); these check the semantics fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from forkd.guest.agent.cell_output import OUTPUT_CAP
from forkd.guest.agent.contexts import CodeContexts
from forkd.guest.agent.evaluator import Evaluator
from forkd.guest.agent.files import Files
from forkd.guest.protocol import CONFLICT, INVALID, NOT_FOUND, RequestError


@pytest.fixture
def contexts() -> CodeContexts:
    import math  # stands in for the guest's warm numpy (the host's venv has none)

    warm: dict[str, Any] = {"__name__": "__forkd__", "math": math}
    return CodeContexts(warm, Evaluator(warm))


def run(ctx: CodeContexts, code: str, **extra: Any) -> dict[str, Any]:
    return ctx.handle({"op": "run", "code": code, **extra})


def test_state_persists_and_the_last_expression_is_the_result(contexts: CodeContexts) -> None:
    first = run(contexts, "x = 1")
    assert first["text"] is None and first["error"] is None and first["execution_count"] == 1
    second = run(contexts, "x + 1")
    assert second["text"] == "2" and second["execution_count"] == 2
    assert run(contexts, "math.sqrt(x + 3)")["text"] == "2.0"


def test_stdout_and_stderr_are_captured(contexts: CodeContexts) -> None:
    res = run(contexts, "import sys\nprint('hello')\nprint('oops', file=sys.stderr)\n7")
    assert (res["stdout"], res["stderr"], res["text"]) == ("hello\n", "oops\n", "7")


def test_errors_carry_name_value_and_traceback(contexts: CodeContexts) -> None:
    res = run(contexts, "def f():\n    return 1 / 0\nf()")
    assert res["error"]["name"] == "ZeroDivisionError"
    assert res["error"]["value"] == "division by zero"
    assert "Traceback" in res["error"]["traceback"] and "in f" in res["error"]["traceback"]
    assert "contexts.py" not in res["error"]["traceback"]  # it starts at the cell
    syntax = run(contexts, "def (")["error"]
    assert syntax["name"] == "SyntaxError"
    # A failing cell keeps what ran before the error.
    run(contexts, "y = 5\nraise KeyError('k')")
    assert run(contexts, "y")["text"] == "5"


def test_named_contexts_are_separate_and_see_the_warm_modules(contexts: CodeContexts) -> None:
    run(contexts, "shared = 'default'")
    ctx = contexts.handle({"op": "create", "cwd": "/tmp"})
    assert ctx["language"] == "python" and ctx["cwd"] == "/tmp"
    assert run(contexts, "shared", context=ctx["id"])["error"]["name"] == "NameError"
    assert run(contexts, "math.floor(3.5)", context=ctx["id"])["text"] == "3"
    ids = {c["id"] for c in contexts.handle({"op": "list"})["contexts"]}
    assert ids == {"default", ctx["id"]}
    run(contexts, "z = 1", context=ctx["id"])
    contexts.handle({"op": "restart", "context": ctx["id"]})
    assert run(contexts, "z", context=ctx["id"])["error"]["name"] == "NameError"
    contexts.handle({"op": "remove", "context": ctx["id"]})
    with pytest.raises(RequestError) as missing:
        run(contexts, "1", context=ctx["id"])
    assert missing.value.kind == NOT_FOUND


def test_restarting_the_default_context_keeps_the_warm_modules(contexts: CodeContexts) -> None:
    run(contexts, "gone = 1")
    contexts.handle({"op": "restart", "context": "default"})
    assert run(contexts, "gone")["error"]["name"] == "NameError"
    assert run(contexts, "math.floor(2.5)")["text"] == "2"
    with pytest.raises(RequestError):
        contexts.handle({"op": "remove", "context": "default"})


def test_env_applies_to_the_run_only(contexts: CodeContexts) -> None:
    code = "import os\nos.environ.get('FORKD_CTX_TEST')"
    assert run(contexts, code, env={"FORKD_CTX_TEST": "on"})["text"] == "'on'"
    assert run(contexts, code)["text"] is None


def test_time_limit_is_an_error_and_output_is_bounded(contexts: CodeContexts) -> None:
    slow = run(contexts, "import time\nwhile True: time.sleep(0.01)", timeout_secs=0.5)
    assert slow["error"]["name"] == "TimeoutError"
    assert run(contexts, "1 + 1")["text"] == "2"  # the evaluator is free again
    big = run(contexts, f"print('x' * {OUTPUT_CAP + 10})")
    assert len(big["stdout"]) < OUTPUT_CAP + 200 and "dropped" in big["stdout"]


@pytest.mark.parametrize("req", [{"op": "nope"}, {"op": "run", "code": 1},
                                 {"op": "run", "code": "1", "context": "../x"},
                                 {"op": "create", "language": "r"},
                                 {"op": "run", "code": "1", "env": {"A=B": "c"}}])
def test_bad_requests_are_invalid(contexts: CodeContexts, req: dict[str, Any]) -> None:
    with pytest.raises(RequestError) as exc:
        contexts.handle(req)
    assert exc.value.kind == INVALID


def test_move_renames_and_makes_parents(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"\x00\x01")
    moved = Files.move({"source": str(tmp_path / "a.txt"), "destination": str(tmp_path / "d/e/b.txt")})
    assert moved["path"] == str(tmp_path / "d/e/b.txt") and moved["size"] == 2
    assert not (tmp_path / "a.txt").exists()
    with pytest.raises(RequestError) as missing:
        Files.move({"source": str(tmp_path / "nope"), "destination": str(tmp_path / "x")})
    assert missing.value.kind == NOT_FOUND
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("1")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RequestError) as busy:
        Files.move({"source": str(tmp_path / "empty"), "destination": str(tmp_path / "full")})
    assert busy.value.kind == CONFLICT
    with pytest.raises(RequestError):
        Files.move({"source": "/", "destination": str(tmp_path / "root")})
