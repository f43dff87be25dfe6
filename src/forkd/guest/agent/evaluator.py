"""The ``eval`` action: Python code in PID 1's one persistent, warm namespace.

Its own job because it runs user code inside the agent itself. Evals are
serialized, so each sees the effects of the ones before it.
"""

from __future__ import annotations

import ast
import threading
import traceback
from typing import Any

from forkd.guest.protocol import RequestError


def eval_result(result: str | None, error: str | None) -> dict[str, Any]:
    """The eval action's result: ``repr`` of the value, or the error; ``exit_code`` 0 or 1."""
    return {"result": result, "error": error, "exit_code": 0 if error is None else 1}


def describe(exc: BaseException) -> str:
    """The one-line error an eval answers with (``KeyError: 'x'``)."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return f"{type(exc).__name__}: {exc}"
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


class Evaluator:
    """Evaluates code in one namespace that persists across calls (PID 1's warm interpreter)."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        self.namespace = namespace
        self.lock = threading.Lock()  # evals see each other's effects in order

    def evaluate(self, code: object) -> dict[str, Any]:
        if not isinstance(code, str):
            raise RequestError("eval needs 'code': a string")
        try:
            tree = ast.parse(code, mode="exec")
        except (SyntaxError, ValueError) as exc:  # ValueError: NUL bytes before 3.12
            return eval_result(None, f"{type(exc).__name__}: {exc}")
        # Like the REPL: statements run, the value of a trailing expression is the result.
        tail = None
        if tree.body and isinstance(last := tree.body[-1], ast.Expr):
            tree.body.pop()
            tail = ast.Expression(last.value)
        with self.lock:
            try:
                if tree.body:
                    exec(compile(tree, "<eval>", "exec"), self.namespace)
                value = eval(compile(tail, "<eval>", "eval"), self.namespace) if tail else None
                return eval_result(repr(value), None)
            except BaseException as exc:
                return eval_result(None, describe(exc))
