"""A Connect stream cut off unfinished when its sandbox dies, as E2B's own proxy cuts it.

E2B's SDKs tell "the sandbox is gone" from "envd answered an error" by how a stream
ends: a connection dropped mid-stream makes them probe the sandbox, and when it is
gone they raise "the sandbox was killed or reached its end of life". An end message
with an error code (even ``unavailable``) is taken for envd's own answer instead. So
when a stream's sandbox is gone, the Connect app's end message is held back: the
response stays unfinished, and the HTTP server closes the connection under it.

The dispatcher wraps each Connect call in ``cuttable`` and hands the app its ``send``;
the process relay calls ``cut`` when it finds the sandbox gone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

from starlette.types import Message, Send

from forkd.errors import ForkdError

if TYPE_CHECKING:
    from forkd.controller.runtime import Runtime

_CURRENT: ContextVar[StreamCut | None] = ContextVar("forkd_e2b_stream_cut", default=None)


class StreamCut:
    """Whether this call's response is to end unfinished; its ``send`` keeps the end back then."""

    def __init__(self, send: Send) -> None:
        self.cut = False
        self._send = send

    async def send(self, message: Message) -> None:
        if self.cut and message["type"] in ("http.response.body", "http.response.trailers") \
                and not message.get("more_body", False) and not message.get("more_trailers", False):
            return  # the end of the stream: never sent, so the connection closes under it
        await self._send(message)


@contextmanager
def cuttable(send: Send) -> Iterator[StreamCut]:
    """A Connect call whose stream ``cut`` may end unfinished: pass the app ``.send``."""
    stream = StreamCut(send)
    token = _CURRENT.set(stream)
    try:
        yield stream
    finally:
        _CURRENT.reset(token)


def cut() -> None:
    """End the current call's stream unfinished (nothing outside ``cuttable``)."""
    stream = _CURRENT.get()
    if stream is not None:
        stream.cut = True


def sandbox_alive(rt: Runtime, sandbox_id: str) -> bool:
    """Whether the sandbox a broken stream was for still exists (if not, the stream is cut)."""
    try:
        rt.get_sandbox(sandbox_id)
    except ForkdError:
        return False
    return True


__all__ = ["StreamCut", "cut", "cuttable", "sandbox_alive"]
