"""The ``context`` action: named code contexts for the code interpreter (E2B's ``run_code``).

A context is a Python namespace that persists across runs. The ``default``
context *is* PID 1's warm namespace (the one ``eval`` uses, with the warm
imports); others start empty but for the warm modules. A run is like a Jupyter
cell: the statements run, the value of a trailing expression is the result
(its ``repr``), and stdout/stderr written meanwhile are captured; an exception
comes back as its name, value and traceback.

Runs go through the agent's one ``Evaluator`` (its ``evaluate`` is the only
entry used), so they take turns with ``eval`` and are interrupted at their time
limit by the same watchdog. What it evaluates is a one-line call back into this
module (``run_cell``), which runs the user's code in the context's namespace
and leaves the cell's result beside the call, by a token, rather than as the
call's value: no helper name ever appears among the user's variables, and the
evaluator's own bound on a value's length never cuts a cell's output.

Captured output is bounded (``cell_output.OUTPUT_CAP`` per stream; the rest is
dropped and said so), and so is the number of contexts.

A context has a language: where the image runs Jupyter kernels (which then
run every cell, ``forkd.guest.agent.kernels``) also bash or javascript, each
with a default context (``code_messages.default_context``). PID 1 runs Python only.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import os
import re
import threading
import types
import uuid
from collections.abc import Callable
from typing import Any

from forkd.guest import code_messages
from forkd.guest.agent import kernel_specs
from forkd.guest.agent.cell_output import CELL, Capped, cell_error
from forkd.guest.agent.evaluator import EvalTimeout, Evaluator
from forkd.guest.protocol import EVAL_DEFAULT_TIMEOUT_SECS, INVALID, NOT_FOUND, RequestError, request_timeout

DEFAULT = "default"
MAX_CONTEXTS = 64
CONTEXT_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
LANGUAGE = "python"


class _Context:
    def __init__(self, context_id: str, namespace: dict[str, Any], cwd: str,
                 language: str = LANGUAGE) -> None:
        self.id = context_id
        self.namespace = namespace  # a kernel's context (not python) has none of its own
        self.cwd = cwd
        self.language = language
        self.executions = 0

    def info(self) -> dict[str, Any]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}


# The agent's CodeContexts by key, for run_cell: the one-line call names its instance.
_INSTANCES: dict[int, CodeContexts] = {}


def run_cell(instance: int, token: str, context_id: str, code: str, env: dict[str, str]) -> None:
    """What the evaluator runs (in its own thread): one cell, its result filed under ``token``."""
    _INSTANCES[instance].run_in(token, context_id, code, env)


class CodeContexts:
    def __init__(self, warm_namespace: dict[str, Any], evaluator: Evaluator,
                 languages: Callable[[], tuple[str, ...]] = tuple) -> None:
        self._warm = warm_namespace
        self._evaluator = evaluator
        self._languages = languages  # what the image's kernels run (none: PID 1's Python alone)
        self._lock = threading.Lock()  # the table of contexts and the results
        home = self._home = code_messages.KERNEL_HOME if os.path.isdir(code_messages.KERNEL_HOME) else "/"
        # With kernels, python's default context is IPython's kernel, which starts in the home as
        # E2B's do; without, it is PID 1's own namespace, whose eval runs where PID 1 does (/).
        self._contexts: dict[str, _Context] = {
            DEFAULT: _Context(DEFAULT, warm_namespace, home if languages() else "/")}
        for language in languages():
            if (name := code_messages.default_context(language)) != DEFAULT:
                self._contexts[name] = self._new(name, home, language)
        self._results: dict[str, dict[str, Any]] = {}
        self._abandoned: set[str] = set()  # tokens whose caller stopped waiting
        _INSTANCES[id(self)] = self

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        if op == "run":
            return self.run(req)
        if op == "create":
            return self.create(req)
        if op == "list":
            with self._lock:
                return {"contexts": [c.info() for c in self._contexts.values()]}
        if op in ("remove", "restart"):
            return self.remove_or_restart(req, restart=op == "restart")
        raise RequestError(f"context op must be run, create, list, remove or restart, not {op!r}", INVALID)

    # ------------------------------------------------------------------ table

    def _new(self, context_id: str, cwd: str, language: str) -> _Context:
        namespace = self._fresh_namespace() if language == LANGUAGE else {}
        return _Context(context_id, namespace, cwd, language)

    def _fresh_namespace(self) -> dict[str, Any]:
        """Empty but for the warm modules (numpy, ...), which cost nothing to share."""
        ns: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        ns.update({k: v for k, v in self._warm.items() if isinstance(v, types.ModuleType)})
        return ns

    def describe(self, context_id: str) -> dict[str, Any] | None:
        """A context's language and cwd, for its kernel (None: not made here)."""
        with self._lock:
            context = self._contexts.get(context_id)
        return None if context is None else context.info()

    def _get(self, req: dict[str, Any]) -> _Context:
        context_id = req.get("context") or DEFAULT
        if not isinstance(context_id, str) or not CONTEXT_ID.match(context_id):
            raise RequestError("context must be 1 to 64 letters, digits, '_' or '-'", INVALID)
        with self._lock:
            context = self._contexts.get(context_id)
        if context is None:
            raise RequestError(f"no code context {context_id!r}", NOT_FOUND)
        return context

    def create(self, req: dict[str, Any]) -> dict[str, Any]:
        language = code_messages.kernel_language(req.get("language"))
        if language != LANGUAGE and language not in self._languages():
            raise RequestError(kernel_specs.missing(language), INVALID)
        cwd = req.get("cwd") or (self._home if self._languages() else "/")  # where its kernel starts
        if not isinstance(cwd, str) or not cwd.startswith("/") or "\0" in cwd:
            raise RequestError("cwd must be an absolute path", INVALID)
        with self._lock:
            if len(self._contexts) >= MAX_CONTEXTS:
                raise RequestError(f"at most {MAX_CONTEXTS} code contexts; remove one first", INVALID)
            context = self._new(uuid.uuid4().hex, cwd, language)
            self._contexts[context.id] = context
        return context.info()

    def remove_or_restart(self, req: dict[str, Any], *, restart: bool) -> dict[str, Any]:
        context = self._get(req)
        if not restart and context.id.startswith(DEFAULT):  # python's, and a language's
            raise RequestError(f"the default context {context.id!r} cannot be removed", INVALID)
        with self._lock:
            if context.id == DEFAULT:
                # PID 1's namespace is the warm state every child inherited: keep the warm
                # modules, drop what runs added.
                kept = {k: v for k, v in self._warm.items() if k.startswith("__") or
                        isinstance(v, types.ModuleType)}
                self._warm.clear()
                self._warm.update(kept)
                context.executions = 0
            elif restart:
                self._contexts[context.id] = self._new(context.id, context.cwd, context.language)
            else:
                del self._contexts[context.id]
        return context.info()

    # ------------------------------------------------------------------ runs

    def run(self, req: dict[str, Any]) -> dict[str, Any]:
        code = req.get("code")
        if not isinstance(code, str):
            raise RequestError("context run needs 'code': a string", INVALID)
        env = req.get("env") or {}
        if not isinstance(env, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\0" not in k + v
                for k, v in env.items()):
            raise RequestError("env must map variable names to strings", INVALID)
        context = self._get(req)
        if context.language != LANGUAGE:
            raise RequestError(f"{context.id!r} is a {context.language} context: its cells run on its "
                               "Jupyter kernel", INVALID)
        timeout = request_timeout(req, EVAL_DEFAULT_TIMEOUT_SECS)
        token = uuid.uuid4().hex
        answer = self._evaluator.evaluate(
            f"__import__({__name__!r}, fromlist=['run_cell']).run_cell("
            f"{id(self)}, {token!r}, {context.id!r}, {code!r}, {env!r})", timeout)
        with self._lock:
            result = self._results.pop(token, None)
            if result is None:  # a cell stuck in a C call may still finish: drop its result then
                self._abandoned.add(token)
        if result is None:  # the time limit (or the call itself) failed before the cell ended
            error = str(answer.get("error") or "RuntimeError: the cell did not run")
            name, _, value = error.partition(": ")
            return {"text": None, "stdout": "", "stderr": "", "execution_count": context.executions,
                    "error": {"name": name, "value": value, "traceback": error}}
        return result

    def run_in(self, token: str, context_id: str, code: str, env: dict[str, str]) -> None:
        """In the evaluator's thread: one cell in the context's namespace; its result kept."""
        result = self._cell(context_id, code, env)
        with self._lock:
            if token in self._abandoned:
                self._abandoned.discard(token)
            else:
                self._results[token] = result

    def _cell(self, context_id: str, code: str, env: dict[str, str]) -> dict[str, Any]:
        with self._lock:
            context = self._contexts.get(context_id)
        if context is None:  # removed since the request was checked
            missing = {"name": "KeyError", "value": f"no code context {context_id!r}", "traceback": ""}
            return {"text": None, "stdout": "", "stderr": "", "execution_count": 0, "error": missing}
        context.executions += 1
        out, err = Capped(), Capped()
        text: str | None = None
        error: dict[str, str] | None = None
        saved = {k: os.environ.get(k) for k in env}
        try:
            os.environ.update(env)
            tree = ast.parse(code, mode="exec")
            tail = None
            if tree.body and isinstance(last := tree.body[-1], ast.Expr):
                tree.body.pop()
                tail = ast.Expression(last.value)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                if tree.body:
                    exec(compile(tree, CELL, "exec"), context.namespace)
                value = eval(compile(tail, CELL, "eval"), context.namespace) if tail else None
            if value is not None:
                text = repr(value)
        except EvalTimeout:
            raise  # the watchdog's: the evaluator answers with the time limit
        except BaseException as exc:  # the user's code failed: report it as Jupyter does
            error = cell_error(exc)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        return {"text": text, "stdout": out.text(), "stderr": err.text(), "error": error,
                "execution_count": context.executions}
