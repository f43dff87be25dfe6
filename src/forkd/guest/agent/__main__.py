"""The agent's entry point: ``python3 -u /opt/forkd/forkd/guest/agent/__main__.py`` as PID 1.

The guest's init runs this file by its path (``python3 -m forkd.guest.agent``
works too, as the tests run it). Run by path, it puts the agent's root
(``/opt/forkd``) first on ``sys.path`` in place of its own directory: that is
what eval'd code sees, as it did when the agent was one script there, and no
PYTHONPATH leaks into the commands that ``exec`` runs.

This file must parse on an old python3 (3.6 on: nothing newer than f-strings,
no annotations that need ``from __future__``), so that one older than
``MIN_GUEST_PYTHON`` is refused with a message on the console rather than a
SyntaxError; the package's other modules are imported only after that check.

``--stdio`` serves the protocol on stdin/stdout instead of the virtio-serial
port, for host-side tests; it stops at EOF.
"""

import os
import signal
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, NoReturn

if not __package__:  # run by path: the agent's root replaces this file's directory
    _HERE = os.path.dirname(os.path.abspath(__file__))
    _ROOT = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))
    if sys.path and sys.path[0] == _HERE:
        sys.path[0] = _ROOT
    else:  # -I or -P: no script directory on the path
        sys.path.insert(0, _ROOT)

from forkd.guest.agent import MIN_GUEST_PYTHON

if TYPE_CHECKING:
    from forkd.guest.agent.server import Agent


def _sleep_forever() -> NoReturn:
    while True:
        time.sleep(3600)


def _die(message: str) -> NoReturn:
    """Report on the console and stop; PID 1 must never exit (the kernel would panic)."""
    print("forkd-agent: " + message, file=sys.stderr, flush=True)
    if os.getpid() == 1:
        _sleep_forever()
    sys.exit(1)


def check_python() -> None:
    if sys.version_info[:2] < MIN_GUEST_PYTHON:
        wanted = ".".join(map(str, MIN_GUEST_PYTHON))
        _die(f"needs Python {wanted} or newer in the guest; this image's python3 is {sys.version.split()[0]}")


def serve_stdio(agent: "Agent") -> None:
    """Serve on private copies of fds 0/1.

    The standard fds then point at /dev/null and stderr, so a print() or input()
    in eval'd code cannot corrupt the reply stream or swallow request bytes.
    """
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    agent.serve(proto_in, proto_out, stop_at_eof=True)


def main() -> None:
    from forkd.guest.agent.network import configure_at_boot as configure_network
    from forkd.guest.agent.server import Agent
    from forkd.guest.agent.setup import cmdline_options, setup_pid1_environment, wait_for_port
    from forkd.guest.agent.warm import warm_list
    from forkd.guest.protocol import PORT_NAME

    opts = cmdline_options()
    is_pid1 = os.getpid() == 1
    if is_pid1:
        setup_pid1_environment()
        configure_network(opts.get("net"))  # a template with a NIC: eth0, route, DNS
        os.chdir("/root" if os.path.isdir("/root") else "/")
    warm = warm_list(opts.get("warm"))
    agent = Agent(warm)
    if is_pid1:
        signal.signal(signal.SIGCHLD, lambda _sig, _frame: agent.reaper.wake.set())
        threading.Thread(target=agent.reaper.run_forever, daemon=True).start()
    if "--stdio" in sys.argv:
        serve_stdio(agent)
        return
    port_name = opts.get("port", PORT_NAME)
    path = wait_for_port(port_name)
    if not path:
        _die(f"virtio-serial port {port_name!r} not found")
    fd = os.open(path, os.O_RDWR)
    print(f"forkd-agent: ready on {path} (warm: {','.join(warm)})", file=sys.stderr, flush=True)
    agent.serve(fd, fd)


def run() -> None:
    try:
        check_python()
        main()
    except SystemExit:  # a deliberate exit: _die has said why
        raise
    except BaseException:
        traceback.print_exc()
        if os.getpid() == 1:  # PID 1 must never exit: the kernel would panic
            _sleep_forever()
        raise


if __name__ == "__main__":
    run()
