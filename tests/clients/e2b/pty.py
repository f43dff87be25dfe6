"""An E2B user's terminal, unchanged: a shell on a pty (prompt, echo, environment), typed
input, a resize the shell sees, a reconnect that carries on, and kill."""

import threading
import time

from e2b import CommandExitException, Sandbox
from e2b.sandbox.commands.command_handle import PtySize


def reading(handle, sink):
    """The sync SDK reads a terminal's output in ``wait``: a thread waits, ``sink`` gets it."""
    ended = []

    def run():
        try:
            ended.append(handle.wait(on_pty=sink.append))
        except Exception as exc:  # the end (a non-zero exit raises) or a disconnect
            ended.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, ended


def wait_for(chunks, text, seconds=60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if text in b"".join(chunks):
            return
        time.sleep(0.1)
    raise AssertionError(f"{text!r} never came: {b''.join(chunks)!r}")


with Sandbox.create() as sbx:
    got = []
    terminal = sbx.pty.create(PtySize(cols=80, rows=24), envs={"GREETING": "hello"}, cwd="/tmp")
    first, ended = reading(terminal, got)
    sbx.pty.send_stdin(terminal.pid, b"echo $GREETING-$(whoami)-$(pwd); tty; stty size\n")
    wait_for(got, b"hello-user-/tmp")  # E2B's user, the asked cwd and environment
    wait_for(got, b"/dev/pts/")  # a real terminal
    wait_for(got, b"24 80")
    assert b"echo $GREETING" in b"".join(got)  # the terminal echoes what is typed
    assert b"user@" in b"".join(got) or b"$ " in b"".join(got), b"".join(got)  # bash's prompt

    sbx.pty.resize(terminal.pid, PtySize(cols=132, rows=50))
    sbx.pty.send_stdin(terminal.pid, b"stty size\n")
    wait_for(got, b"50 132")

    sbx.pty.send_stdin(terminal.pid, b"exit\n")
    first.join(60)
    assert len(ended) == 1 and ended[0].exit_code == 0, ended

    # Disconnect and connect again: the shell carries on; the new handle sees what follows.
    shell = sbx.pty.create(PtySize(cols=80, rows=24))
    sbx.pty.send_stdin(shell.pid, b"MARK=kept\n")
    shell.disconnect()
    again = sbx.pty.connect(shell.pid)
    assert again.pid == shell.pid
    sbx.pty.send_stdin(shell.pid, b"echo mark-$MARK; exit 7\n")
    later = []
    try:
        again.wait(on_pty=later.append)
        raise AssertionError("exit 7 did not raise")
    except CommandExitException as exc:
        assert exc.exit_code == 7, exc
    assert b"mark-kept" in b"".join(later), b"".join(later)

    # kill: the shell is gone, and a pid that is not running says False.
    other = sbx.pty.create(PtySize(cols=80, rows=24))
    assert sbx.pty.kill(other.pid)
    assert not sbx.pty.kill(other.pid)
    assert sbx.commands.run(f"kill -0 {other.pid} 2>/dev/null || echo gone").stdout.strip() == "gone"
print("pty ok")
