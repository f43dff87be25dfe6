"""What a cell run in PID 1's interpreter (``contexts``) prints and raises, as the host gets it.

Its stdout and stderr are captured in ``Capped`` buffers that keep the first
``OUTPUT_CAP`` characters and say how many more were dropped, so one cell
cannot grow the agent; its exception becomes Jupyter's name, value and
traceback, the traceback starting at the cell's own code (``CELL``).
"""

from __future__ import annotations

import io
import traceback

OUTPUT_CAP = 1 << 20  # characters kept per stream of one run
CELL = "<cell>"  # the file name a cell's code is compiled under


class Capped(io.StringIO):
    """A stdout/stderr stand-in that keeps the first ``OUTPUT_CAP`` characters."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0

    def write(self, s: str) -> int:
        room = OUTPUT_CAP - self.tell()
        if room > 0:
            super().write(s[:room])
        self.dropped += max(0, len(s) - max(room, 0))
        return len(s)

    def text(self) -> str:
        tail = f"\n[forkd: {self.dropped} more characters dropped]\n" if self.dropped else ""
        return self.getvalue() + tail


def cell_error(exc: BaseException) -> dict[str, str]:
    """Name, value and traceback of a cell's exception; the traceback starts at the cell
    (the agent's own frames above it are nobody's business)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != CELL:
        tb = tb.tb_next
    return {"name": type(exc).__name__, "value": str(exc),
            "traceback": "".join(traceback.format_exception(type(exc), exc, tb))}
