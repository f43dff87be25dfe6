"""A scripted guest: the agent's wire protocol (``forkd.guest.protocol``) over an in-memory guest.

It stands in for what runs inside a VM, so that the real controller can be tested without
one (``tests.fakes.vmm`` serves it on the agent socket QEMU would have). It is the guest's IO,
not host logic: what the host does with the answers is the real code's.

Its state (``GuestState``: files, environment, hostname, the number of restores) is what a
snapshot keeps: the fake QEMU writes it into the device state, so a child restored from a
snapshot starts with its template's files, as a real one starts with its disk and RAM.

Processes play a few commands: ``echo`` (prints its words, exits 0), ``cat`` (echoes stdin until it
is closed), ``err`` (prints its words on stderr, exits 1), ``sleep`` (runs until signalled),
``bytes`` (prints ``\\xff\\xfe`` and a split "é"), ``missing`` (not found), ``poweroff`` (the VM goes
away at once); anything else prints its argv joined by spaces and exits 0. ``eval`` knows arithmetic,
answers ``answer(<text>)`` with ``<text>``, and runs the ``os.environ.update``/``os.chdir``
statements a template build sends. The kernel (code cells) prints a cell's code and ends.
"""

from __future__ import annotations

import ast
import asyncio
import base64
import contextlib
import itertools
import json
import operator
import posixpath
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forkd.guest import capabilities, code_messages, protocol
from forkd.guest.agent.freeze import check_freeze_mounts

AGENT_VERSION = capabilities.AGENT_VERSION  # lists its capabilities in ping (see capabilities.Capabilities)


@dataclass
class GuestState:
    """What a snapshot of the guest keeps (JSON: the fake QEMU saves it with the device state)."""

    files: dict[str, str | None] = field(
        default_factory=lambda: {"/": None, "/home": None, "/home/user": None, "/tmp": None})
    metadata: dict[str, dict[str, str]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    hostname: str = "forkd"
    restores: int = 0
    cwd: str = "/"  # PID 1's

    def to_json(self) -> dict[str, Any]:
        return {"files": self.files, "metadata": self.metadata, "env": self.env,
                "hostname": self.hostname, "restores": self.restores, "cwd": self.cwd}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GuestState:
        return cls(files=dict(d["files"]), metadata=dict(d.get("metadata") or {}), env=dict(d["env"]),
                   hostname=str(d["hostname"]), restores=int(d["restores"]), cwd=str(d.get("cwd", "/")))


REQUEST_LOG = "guest-requests.jsonl"  # in the VM's run dir


def requests(run_dir: Path) -> list[dict[str, Any]]:
    """The requests the scripted guest of the VM run in ``run_dir`` has received, in order."""
    try:
        text = (run_dir / REQUEST_LOG).read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines()]


class Refused(Exception):
    """An error reply (``kind``: protocol.NOT_FOUND, INVALID, CONFLICT or None)."""

    def __init__(self, text: str, kind: str | None = None) -> None:
        super().__init__(text)
        self.kind = kind


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def _arithmetic(node: ast.AST) -> Any:
    """The value of an expression of number literals and + - * / // %; else ValueError."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(
            node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_arithmetic(node.left), _arithmetic(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_arithmetic(node.operand))
    raise ValueError(f"the scripted guest cannot evaluate {ast.dump(node)[:60]}")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class Process:
    """A scripted process: its events so far, and the streams that watch it."""

    def __init__(self, pid: int, req: dict[str, Any]) -> None:
        self.pid = pid
        self.args: list[str] = list(req["args"])
        self.env: dict[str, str] = dict(req.get("env") or {})
        self.cwd: str | None = req.get("cwd")
        self.tag: str | None = req.get("tag")
        self.user: str | None = req.get("user")
        self.stdin_open = req.get("stdin") is True  # proc_start's "stdin": keep it open
        pty = req.get("pty")
        self.pty: dict[str, int] | None = (
            {"cols": int(pty["cols"]), "rows": int(pty["rows"])} if isinstance(pty, dict) else None)
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.events: list[dict[str, Any]] = [{"type": protocol.EV_START, "pid": pid}]
        self.watchers: dict[int, Callable[[dict[str, Any]], None]] = {}
        self.end: dict[str, Any] | None = None
        stdin = base64.b64decode(req["input"]) if isinstance(req.get("input"), str) else b""
        cmd, words = self.args[0], " ".join(self.args[1:])
        if cmd == "echo":
            self.emit(protocol.EV_STDOUT, f"{words}\n".encode())
            self.finish(0)
        elif cmd == "err":
            self.emit(protocol.EV_STDERR, f"{words}\n".encode())
            self.finish(1)
        elif cmd == "bytes":
            self.emit(protocol.EV_STDOUT, b"\xff\xfe caf\xc3")
            self.emit(protocol.EV_STDOUT, b"\xa9\n")
            self.finish(0)
        elif cmd == "cat":
            if stdin:
                self.emit(protocol.EV_STDOUT, stdin)
            if not self.stdin_open:
                self.finish(0)
        elif cmd != "sleep":
            self.emit(protocol.EV_STDOUT, " ".join(self.args).encode())
            self.finish(0)

    def emit(self, kind: str, data: bytes) -> None:
        self.publish({"type": kind, "data": _b64(data)})

    def publish(self, ev: dict[str, Any]) -> None:
        self.events.append(ev)
        for send in list(self.watchers.values()):
            send(ev)

    def finish(self, exit_code: int, signal: int | None = None) -> None:
        self.end = {"type": "exit", "pid": self.pid, "exit_code": exit_code, "signal": signal,
                    "timed_out": False, "error": None}
        self.stdin_open = False
        self.ended_at = time.time()
        self.publish(self.end)

    def info(self) -> dict[str, Any]:
        return {"pid": self.pid, "tag": self.tag, "args": self.args, "env": self.env, "cwd": self.cwd,
                "user": self.user, "running": self.end is None,
                "exit_code": self.end["exit_code"] if self.end else None,
                "signal": self.end["signal"] if self.end else None, "timed_out": False,
                "stdin_open": self.stdin_open, "started_at": self.started_at, "ended_at": self.ended_at,
                "pty": self.pty}


class ScriptedGuest:
    """Answers the agent protocol on every connection ``serve`` is given."""

    def __init__(self, state: GuestState | None = None, log: Path | None = None,
                 poweroff: Callable[[], None] = lambda: None) -> None:
        self.poweroff = poweroff  # what "poweroff" does: the VM's process ends
        self.state = state or GuestState()
        self.log = log  # every request received is appended here, a JSON line each (``requests``)
        self.processes: dict[int, Process] = {}
        self._pids = itertools.count(100)
        self._handles: dict[str, tuple[str, bytearray, dict[str, str] | None]] = {}
        self._handle_ids = itertools.count(1)
        self._boot = time.time()
        self.cells = 0
        # Directory watchers: id -> (directory, recursive, entries, events not yet polled).
        self._watchers: dict[str, tuple[str, bool, bool, list[dict[str, Any]]]] = {}
        self._watcher_ids = itertools.count(1)
        # Named code contexts (PID 1's interpreter, where an image has no kernel): id -> ContextInfo.
        self._contexts: dict[str, dict[str, str]] = {"default": {"id": "default", "language": "python",
                                                                 "cwd": "/"}}
        self._context_ids = itertools.count(1)

    # ------------------------------------------------------------ wire

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: a request a line, answered in order (streams answer with events first)."""

        def send(message: dict[str, Any]) -> None:
            if not writer.is_closing():
                writer.write(protocol.encode(message))

        streams: dict[int, Process] = {}
        try:
            while line := await reader.readline():
                req = protocol.decode(line)
                self.answer(req, send, streams)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            for stream_id, proc in streams.items():
                proc.watchers.pop(stream_id, None)
            writer.close()

    def answer(self, req: dict[str, Any], send: Callable[[dict[str, Any]], None],
               streams: dict[int, Process]) -> None:
        req_id, action = req.get("id"), req.get("action")
        if self.log is not None:
            with open(self.log, "a") as f:
                f.write(json.dumps(req) + "\n")
        args = {k: v for k, v in req.items() if k not in ("id", "action")}
        if action == protocol.PROC_DETACH:  # notifications: no reply
            proc = streams.pop(int(args["stream"]), None)
            if proc is not None:
                proc.watchers.pop(int(args["stream"]), None)
            return
        if action == protocol.PROC_ACK:
            return
        try:
            if action in (protocol.PROC_START, protocol.PROC_ATTACH) and (
                    action == protocol.PROC_ATTACH or args.get("stream")):
                if not isinstance(req_id, int):
                    raise Refused("a streaming request needs an integer id", protocol.INVALID)
                self._stream(req_id, action, args, send, streams)
                return
            if action == protocol.EXEC:
                self._exec(req_id, args, send)
                return
            if action == protocol.KERNEL and args.get("op") == "run":
                self._cell(req_id, args, send)
                return
            handler = getattr(self, f"do_{action}", None)
            if handler is None:
                raise Refused(f"unknown action {action!r}")
            send(protocol.ok_reply(req_id, handler(**args)))
        except Refused as exc:
            send(protocol.error_reply(req_id, str(exc), exc.kind))
        except protocol.RequestError as exc:
            send(protocol.error_reply(req_id, str(exc), exc.kind))
        except (TypeError, KeyError, ValueError) as exc:  # a request this script does not know
            traceback.print_exc()  # into the VM's qemu.log
            send(protocol.error_reply(req_id, f"scripted guest: bad {action!r} request: {exc!r}",
                                      protocol.INVALID))

    # ------------------------------------------------------------ calls

    def _identity(self) -> dict[str, Any]:
        return {"agent_version": AGENT_VERSION,
                "capabilities": capabilities.capabilities_since(int(AGENT_VERSION))}

    def do_ping(self) -> dict[str, Any]:
        return {"pong": True, "pid": 1, "python_version": "3.11.2", "numpy_version": "1.24.2",
                "warm": [], "warm_errors": None, "restores": self.state.restores, **self._identity()}

    def do_restored(self, **req: Any) -> dict[str, Any]:
        if req.get("clock_only"):
            return {"clock_stepped": True, "time_ns": time.time_ns(), **self._identity()}
        inputs = protocol.RestoreInputs.from_wire(req)
        self.state.restores += 1
        self.state.env.update(inputs.env)
        if inputs.hostname is not None:
            self.state.hostname = inputs.hostname
        return {"reseeded": True, "clock_stepped": True, "time_ns": time.time_ns(),
                "env_set": len(inputs.env), "steps_us": {"reseed": 1}, **self._identity()}

    def do_sync(self) -> dict[str, Any]:
        return {"synced": True}

    def do_fsfreeze(self, mounts: list[str] | None = None) -> dict[str, Any]:
        check_freeze_mounts(mounts)
        return {"frozen": True}

    def do_fsthaw(self) -> dict[str, Any]:
        return {"thawed": True}

    def do_pid1_defaults(self, env: dict[str, str] | None = None, cwd: str | None = None) -> dict[str, Any]:
        """A template build's ENV and WORKDIR in PID 1 (agent 15 on)."""
        self.state.env.update(protocol.check_env(env))
        if cwd is not None:
            self.state.cwd = cwd
        return {"applied": True}

    def _os_statements(self, code: str) -> bool:
        """Run ``code`` if it is only ``__import__('os').environ.update({...})`` and
        ``__import__('os').chdir("...")`` statements of literals (what a template build sends an
        agent older than 15 to set ENV and WORKDIR in PID 1); False if it is anything else."""
        try:
            body = ast.parse(code, mode="exec").body
        except SyntaxError:
            return False
        calls: list[tuple[str, Any]] = []
        for stmt in body:
            if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
                    and len(stmt.value.args) == 1):
                return False
            name = ast.unparse(stmt.value.func)
            if name not in ("__import__('os').environ.update", "__import__('os').chdir"):
                return False
            try:
                calls.append((name, ast.literal_eval(stmt.value.args[0])))
            except ValueError:
                return False
        for name, value in calls:
            if name.endswith("update"):
                self.state.env.update({str(k): str(v) for k, v in dict(value).items()})
            else:
                self.state.cwd = str(value)
        return bool(calls)

    def do_eval(self, code: str, timeout_secs: float = 60) -> dict[str, Any]:
        if self._os_statements(code):
            return {"result": None, "error": None, "exit_code": 0}
        with contextlib.suppress(SyntaxError):
            node = ast.parse(code, mode="eval").body
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "answer"
                    and len(node.args) == 1 and isinstance(node.args[0], ast.Constant)):
                return {"result": str(node.args[0].value), "error": None, "exit_code": 0}
        try:
            value = _arithmetic(ast.parse(code, mode="eval").body)
        except (SyntaxError, ValueError, ArithmeticError) as exc:
            return {"result": None, "error": f"{type(exc).__name__}: {exc}", "exit_code": 1}
        return {"result": repr(value), "error": None, "exit_code": 0}

    def do_eval_cancel(self) -> dict[str, Any]:
        return {"cancelled": False}

    def _exec(self, req_id: Any, args: dict[str, Any], send: Callable[[dict[str, Any]], None]) -> None:
        text = args.get("stdin")  # exec's stdin: text, all of it
        proc = Process(0, {**args, "stdin": False,
                           "input": _b64(text.encode()) if isinstance(text, str) else None})
        if proc.end is None:  # nothing more will come: a sleep or an open cat never ends here
            proc.finish(-9, 9)
        for ev in proc.events[1:-1]:
            send(protocol.event(req_id, ev))
        end = proc.end
        assert end is not None
        send(protocol.ok_reply(req_id, {"exit_code": end["exit_code"], "error": None, "timed_out": False,
                                        "duration_ms": 1.0}))

    # ------------------------------------------------------------ processes

    def _new_process(self, args: dict[str, Any]) -> Process:
        argv = args.get("args")
        if not isinstance(argv, list) or not argv:
            raise Refused("args must be a non-empty list", protocol.INVALID)
        if argv[0] == "missing":
            raise Refused(f"executable not found: {argv[0]}", protocol.INVALID)
        if argv[0] == "poweroff":
            self.poweroff()
        proc = Process(next(self._pids), args)
        self.processes[proc.pid] = proc
        return proc

    def _proc(self, pid: int) -> Process:
        proc = self.processes.get(pid)
        if proc is None:
            raise Refused(f"no process {pid} (it may have ended long ago)", protocol.NOT_FOUND)
        return proc

    def _stream(self, req_id: int, action: str, args: dict[str, Any], send: Callable[[dict[str, Any]], None],
                streams: dict[int, Process]) -> None:
        if action == protocol.PROC_START:
            proc, backlog = self._new_process(args), None
        else:
            proc = self._proc(int(args["pid"]))
            backlog = proc.events if args.get("from_start", True) else proc.events[:1]
        events = list(proc.events if backlog is None else backlog)

        def forward(ev: dict[str, Any]) -> None:
            if ev.get("type") == "exit":
                proc.watchers.pop(req_id, None)
                streams.pop(req_id, None)
                send(protocol.ok_reply(req_id, ev))
            else:
                send(protocol.event(req_id, ev))

        for ev in events:
            if ev.get("type") != "exit":
                forward(ev)
        if proc.end is not None:
            forward(proc.end)
            return
        proc.watchers[req_id] = forward
        streams[req_id] = proc

    def do_proc_start(self, **args: Any) -> dict[str, Any]:
        return self._new_process(args).info()

    def do_proc_list(self) -> dict[str, Any]:
        return {"processes": [p.info() for p in self.processes.values() if p.end is None]}

    def do_proc_info(self, pid: int) -> dict[str, Any]:
        return self._proc(pid).info()

    def do_proc_input(self, pid: int, data: str = "", eof: bool = False) -> dict[str, Any]:
        proc = self._proc(pid)
        if not proc.stdin_open:
            raise Refused(f"process {pid} has no open stdin (start it with stdin open)", protocol.CONFLICT)
        raw = base64.b64decode(data)
        if raw and proc.args[0] == "cat":
            proc.emit(protocol.EV_STDOUT, raw)
        if eof:
            proc.stdin_open = False
            if proc.args[0] == "cat":
                proc.finish(0)
        return {"written": len(raw)}

    def do_proc_signal(self, pid: int, signal: int, group: bool = True, wait_ms: int = 0) -> dict[str, Any]:
        proc = self._proc(pid)
        if proc.end is not None:
            raise Refused(f"process {pid} is not running", protocol.NOT_FOUND)
        if signal in (2, 9, 15):  # what ends a scripted process
            proc.finish(-signal, signal)
        return {"signalled": True}

    def do_proc_resize(self, pid: int, cols: int, rows: int) -> dict[str, Any]:
        proc = self._proc(pid)
        if proc.pty is None:
            raise Refused(f"process {pid} was not started on a terminal (pty)", protocol.CONFLICT)
        if proc.end is not None:
            raise Refused(f"process {pid} is not running", protocol.NOT_FOUND)
        proc.pty = {"cols": cols, "rows": rows}
        return {"resized": True}

    # ------------------------------------------------------------ files

    def _norm(self, path: str) -> str:
        protocol.check_path(path)
        if not path.startswith("/"):
            path = posixpath.join("/home/user", path)
        return posixpath.normpath(path).replace("//", "/")

    def _info(self, path: str) -> dict[str, Any]:
        data = self.state.files[path]
        info: dict[str, Any] = {
            "path": path, "name": posixpath.basename(path) or "/",
            "type": "dir" if data is None else "file",
            "size": 0 if data is None else len(base64.b64decode(data)),
            "mode": 0o755 if data is None else 0o644, "mtime": self._boot, "owner": "root", "group": "root"}
        if found := self.state.metadata.get(path):
            info["metadata"] = dict(found)
        return info

    def _existing(self, path: str) -> str:
        norm = self._norm(path)
        if norm not in self.state.files:
            raise Refused(f"{path}: No such file or directory", protocol.NOT_FOUND)
        return norm

    def _parent_dir(self, path: str) -> None:
        parent = posixpath.dirname(path)
        if parent not in self.state.files:
            raise Refused(f"{parent}: No such file or directory", protocol.NOT_FOUND)
        if self.state.files[parent] is not None:
            raise Refused(f"{parent}: Not a directory", protocol.CONFLICT)

    def _make_parents(self, path: str) -> None:
        parts = path.strip("/").split("/")
        for i in range(1, len(parts)):
            self.state.files.setdefault("/" + "/".join(parts[:i]), None)

    def do_file_stat(self, path: str, user: str | None = None) -> dict[str, Any]:
        return self._info(self._existing(path))

    def do_file_list(self, path: str, user: str | None = None) -> dict[str, Any]:
        norm = self._existing(path)
        if self.state.files[norm] is not None:
            raise Refused(f"{path}: Not a directory", protocol.CONFLICT)
        entries = [self._info(p) for p in sorted(self.state.files)
                   if p != norm and posixpath.dirname(p) == norm]
        return {"path": norm, "entries": entries, "truncated": False}

    def do_file_mkdir(self, path: str, parents: bool = False, user: str | None = None) -> dict[str, Any]:
        norm = self._norm(path)
        if norm in self.state.files:
            if parents and self.state.files[norm] is None:
                return {"created": False}
            raise Refused(f"{path}: File exists", protocol.CONFLICT)
        if parents:
            self._make_parents(norm)
        self._parent_dir(norm)
        self.state.files[norm] = None
        self._changed(norm, "create")
        return {"created": True}

    def do_file_remove(self, path: str, recursive: bool = False, user: str | None = None) -> dict[str, Any]:
        norm = self._existing(path)
        if norm == "/":
            raise Refused("refusing to remove /", protocol.CONFLICT)
        inside = [p for p in self.state.files if p.startswith(norm + "/")]
        if inside and not recursive:
            raise Refused(f"{path}: directory not empty (use recursive)", protocol.CONFLICT)
        for p in [*inside, norm]:
            del self.state.files[p]
            self.state.metadata.pop(p, None)
        self._changed(norm, "remove")
        return {"removed": True}

    def do_file_move(self, source: str, destination: str, user: str | None = None) -> dict[str, Any]:
        src, dst = self._existing(source), self._norm(destination)
        if src == "/" or dst == src or dst.startswith(src + "/"):
            raise Refused(f"cannot move {source} into itself", protocol.CONFLICT)
        if dst in self.state.files:
            raise Refused(f"{destination}: File exists", protocol.CONFLICT)
        self._make_parents(dst)
        self._parent_dir(dst)
        for path in sorted(p for p in list(self.state.files) if p == src or p.startswith(src + "/")):
            moved = dst + path[len(src):]
            self.state.files[moved] = self.state.files.pop(path)
            if path in self.state.metadata:
                self.state.metadata[moved] = self.state.metadata.pop(path)
        self._changed(src, "rename")
        self._changed(dst, "create")
        return self._info(dst)

    def do_file_read(self, path: str, offset: int = 0, length: int = protocol.FILE_CHUNK,
                     user: str | None = None) -> dict[str, Any]:
        norm = self._existing(path)
        data = self.state.files[norm]
        if data is None:
            raise Refused(f"{path}: Is a directory", protocol.CONFLICT)
        raw = base64.b64decode(data)
        piece = raw[offset:offset + length]
        return {"data": _b64(piece), "eof": offset + len(piece) >= len(raw)}

    def do_file_write_open(self, path: str, mode: int | None = None, metadata: dict[str, str] | None = None,
                           user: str | None = None) -> dict[str, Any]:
        norm = self._norm(path)
        if self.state.files.get(norm, "") is None:
            raise Refused(f"{path}: Is a directory", protocol.CONFLICT)
        self._make_parents(norm)
        self._parent_dir(norm)
        handle = f"h{next(self._handle_ids)}"
        self._handles[handle] = (norm, bytearray(), metadata)
        return {"handle": handle}

    def do_file_write(self, handle: str, offset: int, data: str) -> dict[str, Any]:
        if handle not in self._handles:
            raise Refused(f"no upload {handle!r}", protocol.NOT_FOUND)
        buf = self._handles[handle][1]
        raw = base64.b64decode(data)
        if len(buf) < offset:
            buf.extend(bytes(offset - len(buf)))
        buf[offset:offset + len(raw)] = raw
        return {"written": len(raw)}

    def do_file_write_close(self, handle: str, commit: bool) -> dict[str, Any]:
        if handle not in self._handles:
            raise Refused(f"no upload {handle!r}", protocol.NOT_FOUND)
        path, buf, metadata = self._handles.pop(handle)
        if not commit:
            return {"aborted": True}
        replaced = path in self.state.files
        self.state.files[path] = _b64(bytes(buf))
        # As the agent reports an upload landing: the file made (if new), written, given its mode.
        self._changed(path, *(("write", "chmod") if replaced else ("create", "write", "chmod")))
        self.state.metadata.pop(path, None)  # a new file: only this upload's metadata
        if metadata:
            self.state.metadata[path] = dict(metadata)
        return self._info(path)

    # ------------------------------------------------------------ watches

    def _changed(self, path: str, *kinds: str) -> None:
        """Queue ``kinds`` events about ``path`` for every watcher of its directory (as inotify
        would: a watcher of a directory sees what happens in it, a recursive one below it too)."""
        for directory, recursive, _, queue in self._watchers.values():
            parent = posixpath.dirname(path)
            if parent == directory or (recursive and path.startswith(directory.rstrip("/") + "/")):
                name = path[len(directory.rstrip("/")) + 1:]
                queue += [{"name": name, "type": kind} for kind in kinds]

    def do_watch(self, op: str, **args: Any) -> dict[str, Any]:
        if op == "create":
            norm = self._existing(str(args.get("path")))
            if self.state.files[norm] is not None:
                raise Refused(f"{norm} is not a directory", protocol.INVALID)
            watcher = f"w{next(self._watcher_ids)}"
            self._watchers[watcher] = (norm, args.get("recursive") is True, args.get("entries") is True, [])
            return {"watcher": watcher}
        found = self._watchers.get(str(args.get("watcher")))
        if found is None:
            raise Refused(f"no directory watcher {str(args.get('watcher'))[:40]!r}", protocol.NOT_FOUND)
        if op == "remove":
            self._watchers.pop(str(args["watcher"]))
            return {"removed": True}
        if op == "events":
            directory, _, entries, queue = found
            events, queue[:] = list(queue), []
            if entries:  # each with what its path names now; none if it names nothing any more
                for ev in events:
                    path = posixpath.join(directory, ev["name"])
                    if path in self.state.files:
                        ev["entry"] = self._info(path)
            return {"events": events, "overflowed": False}
        raise Refused(f"unknown watch op {op[:40]!r}", protocol.INVALID)

    # ------------------------------------------------------------ code contexts

    def do_context(self, op: str, **args: Any) -> dict[str, Any]:
        """Code contexts: a cell prints its code (as the kernel's does) and has no value."""
        if op == "create":
            context = {"id": f"c{next(self._context_ids)}", "language": args.get("language") or "python",
                       "cwd": args.get("cwd") or "/"}
            self._contexts[context["id"]] = context
            return context
        if op == "list":
            return {"contexts": list(self._contexts.values())}
        found = self._contexts.get(str(args.get("context") or "default"))
        if found is None:
            raise Refused(f"no code context {str(args.get('context'))[:40]!r}", protocol.NOT_FOUND)
        if op == "run":
            self.cells += 1
            return {"text": None, "stdout": str(args.get("code", "")), "stderr": "", "error": None,
                    "execution_count": self.cells}
        if op in ("remove", "restart"):
            if op == "remove":
                del self._contexts[found["id"]]
            return found
        raise Refused(f"unknown context op {op[:40]!r}", protocol.INVALID)

    # ------------------------------------------------------------ kernels

    def _cell(self, req_id: Any, args: dict[str, Any], send: Callable[[dict[str, Any]], None]) -> None:
        """A kernel that prints the cell's code and ends (a silent cell sends no events)."""
        self.cells += 1
        if not args.get("silent"):
            send(protocol.event(req_id, {"type": "stdout", "text": str(args.get("code", ""))}))
        send(protocol.ok_reply(req_id, {"type": "end", "execution_count": self.cells, "timed_out": False,
                                        "restarted": False}))

    def do_kernel(self, op: str, **args: Any) -> dict[str, Any]:
        if op == "available":
            return {"available": True, "languages": list(code_messages.KERNEL_LANGUAGES)}
        if op == "interrupt":
            return {"interrupted": False}  # no cell runs long enough here to interrupt
        if op in ("restart", "shutdown"):
            return {"type": "end", "execution_count": 0}
        raise Refused(f"unknown kernel op {op!r}", protocol.INVALID)

