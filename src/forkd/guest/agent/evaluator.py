"""The ``eval`` action: Python code in PID 1's one persistent, warm namespace, with a time limit.

Its own job because it runs user code inside the agent itself. Evals are
serialized, so each sees the effects of the ones before it, and each has a time
limit that the agent enforces: the host gives up after its own limit anyway, and
a runaway eval would otherwise hold the evaluator, and the CPU, for ever.

How the limit works: the code runs in a thread of its own that holds the
evaluator lock. When the request's ``timeout_secs`` is up, a watchdog raises
``EvalTimeout`` in that thread with ``PyThreadState_SetAsyncExc`` (through the
stdlib's ctypes). That interrupts Python code at once, and a C call (``time.sleep``,
a long numpy operation) when it returns to Python. The answer goes back at the
deadline, plus a short grace for the code to unwind, in every case. If the code
is still inside a C call by then, the lock stays held until the call returns,
and later evals wait for it within their own limits.

The watchdog raises only while the thread runs user code, and the thread stops
that and withdraws a pending exception before it does its own bookkeeping; each
of those steps is a check and a C call with no point in between where the
interpreter can switch threads or deliver an exception (see ``_Run``).
"""

from __future__ import annotations

import ast
import ctypes
import threading
import time
import traceback
from typing import Any

from forkd.guest.protocol import EVAL_DEFAULT_TIMEOUT_SECS, RequestError

# After the deadline, how long to wait for the interrupted code to unwind before answering.
INTERRUPT_GRACE_SECS = 1.0
# The exception is raised again at this interval while the code still runs: it may
# have caught the first one (a bare ``except:``), or be inside a C call.
REINTERRUPT_SECS = 0.1

# int PyThreadState_SetAsyncExc(unsigned long id, PyObject *exc); exc NULL withdraws one.
# pythonapi holds the GIL during the call. No argtypes: None must pass as NULL.
_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc


class EvalTimeout(BaseException):
    """Raised in the evaluating thread when its time is up.

    A BaseException, like KeyboardInterrupt, so that ``except Exception`` in the
    evaluated code does not swallow it.
    """


def eval_result(result: str | None, error: str | None) -> dict[str, Any]:
    """The eval action's result: ``repr`` of the value, or the error; ``exit_code`` 0 or 1."""
    return {"result": result, "error": error, "exit_code": 0 if error is None else 1}


def timeout_message(timeout: float, detail: str = "") -> str:
    return f"TimeoutError: eval exceeded {timeout:g} s{detail}"


def describe(exc: BaseException) -> str:
    """The one-line error an eval answers with (``KeyError: 'x'``)."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return f"{type(exc).__name__}: {exc}"
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


class _Run:
    """One eval: its code, its thread, and the state that the watchdog reads.

    ``running`` is True only while the thread runs user code. The watchdog tests
    it and raises in one step (``if run.running: _set_async_exc(*run.raise_args)``),
    and the thread clears it and withdraws a pending exception in one step: an
    attribute test or store and a call into C leave the interpreter no point at
    which to switch threads or deliver an exception. So no exception is raised
    once the thread has left user code, and none ever reaches another thread
    that reuses this one's id.
    """

    def __init__(self, body: ast.Module, tail: ast.Expression | None, timeout: float) -> None:
        self.body = body
        self.tail = tail
        self.timeout = timeout
        self.done = threading.Event()
        self.reply: dict[str, Any] | None = None
        self.running = False
        self.interrupted = False
        self.raise_args: tuple[Any, ...] = ()
        self.withdraw_args: tuple[Any, ...] = ()

    def start(self) -> None:
        """In the evaluating thread, before any user code."""
        thread_id = ctypes.c_ulong(threading.get_ident())
        self.raise_args = (thread_id, ctypes.py_object(EvalTimeout))
        self.withdraw_args = (thread_id, None)
        self.running = True


class Evaluator:
    """Evaluates code in one namespace that persists across calls (PID 1's warm interpreter)."""

    def __init__(self, namespace: dict[str, Any], interrupt_grace: float = INTERRUPT_GRACE_SECS) -> None:
        self.namespace = namespace
        # Held by the evaluating thread: evals see each other's effects in order.
        self.lock = threading.Lock()
        self.interrupt_grace = interrupt_grace

    def evaluate(self, code: object, timeout_secs: float = EVAL_DEFAULT_TIMEOUT_SECS) -> dict[str, Any]:
        if not isinstance(code, str):
            raise RequestError("eval needs 'code': a string")
        deadline = time.monotonic() + timeout_secs
        try:
            tree = ast.parse(code, mode="exec")
        except (SyntaxError, ValueError) as exc:  # ValueError: NUL bytes before 3.12
            return eval_result(None, f"{type(exc).__name__}: {exc}")
        # Like the REPL: statements run, the value of a trailing expression is the result.
        tail = None
        if tree.body and isinstance(last := tree.body[-1], ast.Expr):
            tree.body.pop()
            tail = ast.Expression(last.value)
        if not self.lock.acquire(timeout=timeout_secs):
            return eval_result(
                None, timeout_message(timeout_secs, " waiting for an earlier eval that is still running")
            )
        run = _Run(tree, tail, timeout_secs)
        try:
            threading.Thread(target=self._run, args=(run,), name="forkd-eval", daemon=True).start()
        except BaseException:
            self.lock.release()
            raise
        if not run.done.wait(max(0.0, deadline - time.monotonic())):
            threading.Thread(target=self._watchdog, args=(run,), name="forkd-eval-watchdog",
                             daemon=True).start()
            if not run.done.wait(self.interrupt_grace):
                return eval_result(None, timeout_message(
                    timeout_secs, "; it is inside a call that cannot be interrupted, "
                    "and later evals wait until that call returns"))
        assert run.reply is not None
        return run.reply

    def _run(self, run: _Run) -> None:
        """The evaluating thread; it holds ``self.lock``, taken for it by ``evaluate``."""
        try:
            run.start()
            reply = self._user_code(run)
            run.running = False
            _set_async_exc(*run.withdraw_args)
        except BaseException as exc:  # an EvalTimeout, or one that describing an error raised
            run.running = False
            _set_async_exc(*run.withdraw_args)
            reply = eval_result(None, timeout_message(run.timeout) if run.interrupted else describe(exc))
        # No exception can reach this thread any more.
        run.reply = reply
        self.lock.release()
        run.done.set()

    def _user_code(self, run: _Run) -> dict[str, Any]:
        """Everything that may run user code (or fail on it): compiling, the statements,
        the value, its repr, the error's str."""
        try:
            if run.body.body:
                exec(compile(run.body, "<eval>", "exec"), self.namespace)
            value = eval(compile(run.tail, "<eval>", "eval"), self.namespace) if run.tail else None
            return eval_result(repr(value), None)
        except EvalTimeout:
            raise
        except BaseException as exc:
            return eval_result(None, describe(exc))

    @staticmethod
    def _watchdog(run: _Run) -> None:
        """Raise EvalTimeout in the evaluating thread until it has finished."""
        while not run.done.is_set():
            if run.running:  # test and raise in one step: see _Run
                run.interrupted = True
                _set_async_exc(*run.raise_args)
            run.done.wait(REINTERRUPT_SECS)
