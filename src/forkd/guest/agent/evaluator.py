"""The ``eval`` action: Python code in PID 1's one persistent, warm namespace, with a time limit.

Its own job because it runs user code inside the agent itself. Evals are
serialized, so each sees the effects of the ones before it, and each has a time
limit that the agent enforces: the host gives up after its own limit anyway, and
a runaway eval would otherwise hold the evaluator, and the CPU, for ever. A
running eval can also be cancelled (``eval_cancel``).

Two threads, both started with the first eval and both idle (blocked, never
polling) between evals: the *evaluating thread* takes evals from a queue in
order and runs them; the *watchdog* sleeps until the nearest deadline. When an
eval's ``timeout_secs`` is up, or it is cancelled, the watchdog raises
``EvalTimeout`` in the evaluating thread with ``PyThreadState_SetAsyncExc``
(through the stdlib's ctypes). That interrupts Python code at once, and a C
call (``time.sleep``, a long numpy operation) when it returns to Python. The
answer goes back at the deadline, plus a short grace for the code to unwind, in
every case. If the code is still inside a C call by then, the evaluating thread
stays busy until the call returns, and later evals wait for it within their own
limits. An eval still queued at its deadline is answered then and never runs.

The watchdog raises only while the thread runs user code, and the thread stops
that and withdraws a pending exception before it does its own bookkeeping; each
of those steps is a check and a C call with no point in between where the
interpreter can switch threads or deliver an exception (see ``EvalRun``).
"""

from __future__ import annotations

import ast
import math
import threading
import time
from collections import deque
from types import CodeType
from typing import Any

from forkd.guest.agent.eval_run import (
    CANCELLED,
    INTERRUPT_GRACE_SECS,
    REINTERRUPT_SECS,
    STUCK,
    EvalRun,
    EvalTimeout,
    Reply,
    bounded,
    describe,
    eval_result,
    set_async_exc,
    timeout_message,
)
from forkd.guest.agent.restore import require_python
from forkd.guest.protocol import EVAL_DEFAULT_TIMEOUT_SECS, INVALID, RequestError

__all__ = ["CANCELLED", "EvalTimeout", "Evaluator", "eval_result", "timeout_message"]


class Evaluator:
    """Evaluates code in one namespace that persists across calls (PID 1's warm interpreter)."""

    def __init__(self, namespace: dict[str, Any], interrupt_grace: float = INTERRUPT_GRACE_SECS) -> None:
        self.namespace = namespace
        self.interrupt_grace = interrupt_grace
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # the evaluating thread waits on it
        self._alarm = threading.Condition(self._lock)  # the watchdog waits on it
        self._alarm_at = math.inf  # when the watchdog wakes next by itself
        self._queue: deque[EvalRun] = deque()
        self._current: EvalRun | None = None  # the eval the evaluating thread is on
        self._threads: list[threading.Thread] = []

    @property
    def busy(self) -> bool:
        with self._lock:
            return self._current is not None or bool(self._queue)

    def submit(self, code: object, timeout_secs: float, reply: Reply) -> None:
        """Queue an eval; ``reply`` is called once with its result, from another thread."""
        if not isinstance(code, str):
            raise RequestError("eval needs 'code': a string", INVALID)
        require_python("eval")  # the host refuses first; an older host does not
        run = EvalRun(code, timeout_secs, reply)
        with self._lock:
            if not self._threads:
                for target, name in ((self._evaluate_forever, "forkd-eval"),
                                     (self._watch, "forkd-eval-watchdog")):
                    thread = threading.Thread(target=target, name=name, daemon=True)
                    thread.start()
                    self._threads.append(thread)
            self._queue.append(run)
            self._work.notify()
            # The watchdog sleeps until the nearest deadline it knows: wake it only
            # for a nearer one, so that an eval costs it no wake-up at all.
            if run.deadline < self._alarm_at:
                self._alarm.notify()

    def evaluate(self, code: object, timeout_secs: float = EVAL_DEFAULT_TIMEOUT_SECS) -> dict[str, Any]:
        """Evaluate and wait for the answer (what ``submit`` replies)."""
        done = threading.Event()
        answer: list[dict[str, Any]] = []

        def reply(result: dict[str, Any]) -> None:
            answer.append(result)
            done.set()

        self.submit(code, timeout_secs, reply)
        done.wait()
        return answer[0]

    def cancel(self) -> bool:
        """Interrupt the eval that is running (queued ones run next); False if none is."""
        with self._lock:
            run = self._current
            if run is None or run.answered or run.cancelled:
                return False
            run.cancelled = True
            run.deadline = min(run.deadline, time.monotonic())
            self._alarm.notify()
            return True

    # ------------------------------------------------------ evaluating thread

    def _evaluate_forever(self) -> None:
        while True:
            with self._lock:
                while not self._queue:
                    self._work.wait()
                run = self._queue.popleft()
                if run.answered:  # its deadline passed while it waited its turn
                    continue
                self._current = run
            result = self._run(run)
            with self._lock:
                self._current = None
                answered, run.answered = run.answered, True
            if not answered:  # else the watchdog has answered for it
                run.reply(result)

    def _run(self, run: EvalRun) -> dict[str, Any]:
        try:
            # A lone expression (the common case) compiles directly, at a third of the
            # cost of parsing to a tree and compiling that (measured under TCG).
            compiled: CodeType | ast.Module = compile(run.code, "<eval>", "eval")
        except (SyntaxError, ValueError):
            try:
                compiled = ast.parse(run.code, mode="exec")
            except (SyntaxError, ValueError) as exc:  # ValueError: NUL bytes before 3.12
                return eval_result(None, f"{type(exc).__name__}: {exc}")
        try:
            run.start()
            result = self._user_code(compiled)
            run.running = False
            set_async_exc(*run.withdraw_args)
        except BaseException as exc:  # an EvalTimeout, or one that describing an error raised
            run.running = False
            set_async_exc(*run.withdraw_args)
            result = eval_result(None, run.stop_message() if run.interrupted else describe(exc))
        # No exception can reach this thread any more.
        return result

    def _user_code(self, compiled: CodeType | ast.Module) -> dict[str, Any]:
        """Everything that may run user code (or fail on it): compiling, the statements,
        the value, its repr, the error's str."""
        try:
            if isinstance(compiled, CodeType):
                return bounded(repr(eval(compiled, self.namespace)))
            # Like the REPL: statements run, the value of a trailing expression is the result.
            tree, tail = compiled, None
            if tree.body and isinstance(last := tree.body[-1], ast.Expr):
                tree.body.pop()
                tail = ast.Expression(last.value)
            if tree.body:
                exec(compile(tree, "<eval>", "exec"), self.namespace)
            value = eval(compile(tail, "<eval>", "eval"), self.namespace) if tail else None
            return bounded(repr(value))
        except EvalTimeout:
            raise
        except BaseException as exc:
            return eval_result(None, describe(exc))

    # --------------------------------------------------------------- watchdog

    def _watch(self) -> None:
        """Answer evals at their deadline and interrupt the running one; sleep otherwise."""
        while True:
            late: list[tuple[EvalRun, dict[str, Any]]] = []
            with self._lock:
                wake = self._check(time.monotonic(), late)
                if not late:
                    self._alarm_at = wake
                    now = time.monotonic()
                    self._alarm.wait(None if wake == math.inf else max(0.0, wake - now))
                    self._alarm_at = math.inf
            for run, result in late:
                run.reply(result)

    def _check(self, now: float, late: list[tuple[EvalRun, dict[str, Any]]]) -> float:
        """Under the lock: answer what is due into ``late``, interrupt; when to look again."""
        wake = math.inf
        for run in list(self._queue):
            if run.answered:
                continue
            if now >= run.deadline:
                self._queue.remove(run)
                run.answered = True
                late.append((run, eval_result(None, timeout_message(
                    run.timeout, " waiting for an earlier eval that is still running"))))
            else:
                wake = min(wake, run.deadline)
        current = self._current
        if current is None:
            return wake
        run = current
        if now < run.deadline:
            return min(wake, run.deadline)
        if run.running:  # test and raise in one step: see EvalRun
            run.interrupted = True
            set_async_exc(*run.raise_args)
        wake = min(wake, now + REINTERRUPT_SECS)
        if not run.answered:
            if now >= run.deadline + self.interrupt_grace:
                run.answered = True
                late.append((run, eval_result(None, run.stop_message() + STUCK)))
            else:
                wake = min(wake, run.deadline + self.interrupt_grace)
        return wake
