"""forkd's in-guest agent: PID 1 of every microVM, serving ``forkd.guest.protocol``.

The initramfs ``switch_root``s into ``python3 -u /opt/forkd/forkd/guest/agent/__main__.py``.
The agent imports the configured "warm" modules once at boot, then serves
requests over a virtio-serial port. The VM is snapshotted after warm-up, so every
forked child starts with those modules already imported in this very process:
``eval`` pays no import cost.

Stdlib only: this package and ``forkd/guest/protocol.py`` are copied verbatim
into the guest image (``forkd.image.rootfs.install_agent``) and run on the
image's own python3, which must be at least ``MIN_GUEST_PYTHON``. Nothing here
imports anything else; the unit tests check both claims.

One module per job:

- ``setup``: what an init does (mounts, hostname, loopback) and finding the port
- ``warm``: the warm imports into the eval namespace
- ``reaper``: reaping orphans re-parented to PID 1
- ``exec``: reading process requests, starting a subprocess
- ``processes``: the process table, its one I/O thread, output rings and streams
- ``evaluator``: eval in the persistent namespace, with a timeout and cancel
- ``restore``: reseeding RNGs and stepping the clock in a restored child
- ``files``: stat, list, mkdir, remove, move and chunked reads of files
- ``users``: a request's ``user`` from /etc/passwd, and file actions as that user
- ``contexts``: named code contexts for the code interpreter (runs like notebook cells)
- ``kernels``: cells on IPython kernels, through ``kernel_runner`` (a helper process, not stdlib only)
- ``uploads``: chunked writes of files, through a temp file renamed at the end
- ``watches``: directory watchers on inotify, polled by the host
- ``inotify``: the inotify calls and event decoding, through ctypes
- ``freeze``: FIFREEZE/FITHAW of the root filesystem for live branches
- ``channel``: every message to the host, bounded, and which requests await a reply
- ``workers``: the threads that run requests which block
- ``server``: the request dispatch and the serve loop
- ``__main__``: the entry point (PID 1, or ``--stdio`` for tests)

This file must stay parseable by old Pythons: ``__main__`` reads
``MIN_GUEST_PYTHON`` from it to refuse one with a clear message.
"""

# Debian 12's python3, which the default image (bookworm) ships. A custom rootfs
# whose python3 is older is refused at build time where its version can be read
# (forkd.image.rootfs), and the agent refuses to start on one at boot.
MIN_GUEST_PYTHON = (3, 11)

# Where an image without a Python of its own gets forkd's (forkd.image.guest_runtime): the agent
# runs on it there, and has no Python for eval to offer (it reports no "python" capability).
RUNTIME_PREFIX = "/.forkd/runtime"
