"""One eval: its code, its deadline, its answer, and how it is interrupted.

Its own module because interrupting code that runs in the agent's own
interpreter is delicate, and the rules for it are kept in one place: the
exception (``EvalTimeout``) is raised in the evaluating thread with
``PyThreadState_SetAsyncExc`` (through the stdlib's ctypes), only while that
thread runs this eval's user code (see ``EvalRun``). Also the shapes of an
eval's answer.
"""

from __future__ import annotations

import ctypes
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from forkd.guest.protocol import EVAL_RESULT_MAX_CHARS

# After the deadline, how long to wait for the interrupted code to unwind before answering.
INTERRUPT_GRACE_SECS = 1.0
# The exception is raised again at this interval while the code still runs: it may
# have caught the first one (a bare ``except:``), or be inside a C call.
REINTERRUPT_SECS = 0.1

# int PyThreadState_SetAsyncExc(unsigned long id, PyObject *exc); exc NULL withdraws one.
# pythonapi holds the GIL during the call. No argtypes: None must pass as NULL.
set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc

Reply = Callable[[dict[str, Any]], None]


class EvalTimeout(BaseException):
    """Raised in the evaluating thread when its time is up, or it is cancelled.

    A BaseException, like KeyboardInterrupt, so that ``except Exception`` in the
    evaluated code does not swallow it.
    """


def eval_result(result: str | None, error: str | None) -> dict[str, Any]:
    """The eval action's result: ``repr`` of the value, or the error; ``exit_code`` 0 or 1."""
    return {"result": result, "error": error, "exit_code": 0 if error is None else 1}


def timeout_message(timeout: float, detail: str = "") -> str:
    return f"TimeoutError: eval exceeded {timeout:g} s{detail}"


CANCELLED = "CancelledError: eval cancelled"
STUCK = ("; it is inside a call that cannot be interrupted, "
         "and later evals wait until that call returns")


def describe(exc: BaseException) -> str:
    """The one-line error an eval answers with (``KeyError: 'x'``)."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return f"{type(exc).__name__}: {exc}"
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def bounded(text: str) -> dict[str, Any]:
    """A successful result, cut to ``EVAL_RESULT_MAX_CHARS`` (its reply must fit on the wire)."""
    if len(text) <= EVAL_RESULT_MAX_CHARS:
        return eval_result(text, None)
    out = eval_result(text[:EVAL_RESULT_MAX_CHARS], None)
    out["result_truncated"] = True
    return out


class EvalRun:
    """One eval: its code, its deadline, its answer, and the state that the watchdog reads.

    ``running`` is True only while the evaluating thread runs this eval's user
    code. The watchdog tests it and raises in one step (``if run.running:
    set_async_exc(*run.raise_args)``), and the thread clears it and withdraws a
    pending exception in one step: an attribute test or store and a call into C
    leave the interpreter no point at which to switch threads or deliver an
    exception. So no exception is raised once the thread has left user code, and
    none ever reaches a later eval run by the same thread.
    """

    def __init__(self, code: str, timeout: float, reply: Reply) -> None:
        self.code = code
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.reply = reply
        self.answered = False  # guarded by the evaluator's lock
        self.cancelled = False
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

    def stop_message(self) -> str:
        return CANCELLED if self.cancelled else timeout_message(self.timeout)
