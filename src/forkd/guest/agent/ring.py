"""What a process's output is kept in, and where each watcher of it is.

Its own module because these are the bounds on a process's output in the guest:
the ring keeps only the newest ``PROCESS_RING_BYTES`` (and a bounded number of
pieces), a watch may only run ``STREAM_WINDOW`` ahead of what the host has
acknowledged, and an exec's capture keeps only ``max_output_bytes`` a stream.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from forkd.guest import protocol

# Pieces in a ring at most (many tiny writes must not cost more than their bytes).
RING_MAX_PIECES = 4096
STDOUT, STDERR = protocol.EV_STDOUT, protocol.EV_STDERR


class Ring:
    """The newest output of one process, both streams in order, addressed by absolute byte offset."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pieces: deque[tuple[int, str, bytearray]] = deque()  # (offset, stream, bytes)
        self.start = 0  # offset of the oldest byte kept
        self.end = 0  # offset after the newest byte

    def append(self, stream: str, data: bytes) -> None:
        if self.pieces:
            _, last_stream, last = self.pieces[-1]
            if last_stream == stream and len(last) + len(data) <= protocol.OUTPUT_CHUNK:
                last += data
                self.end += len(data)
                return
        self.pieces.append((self.end, stream, bytearray(data)))
        self.end += len(data)

    def over(self) -> bool:
        return self.end - self.start > self.limit or len(self.pieces) > RING_MAX_PIECES

    def evict(self, keep_from: int) -> None:
        """Drop the oldest pieces while over the limit, but no byte at or after ``keep_from``."""
        while self.pieces and self.over():
            offset, _, data = self.pieces[0]
            if offset + len(data) > keep_from:
                return
            self.pieces.popleft()
            self.start = offset + len(data)
        if not self.pieces:
            self.start = self.end

    def read(self, cursor: int, most: int) -> tuple[str, bytes] | None:
        """Up to ``most`` bytes of one stream from ``cursor`` (at least ``start``), or None at the end."""
        for offset, stream, data in reversed(self.pieces):
            if offset <= cursor:
                piece = bytes(data[cursor - offset:cursor - offset + most])
                return (stream, piece) if piece else None
        return None


class Watch:
    """One host request watching a process: where it is in the ring, what it may still send.

    A lossless watch (the one that started the process) holds the process back
    when the ring is full rather than lose output; a later one is told what it
    missed (a ``dropped`` event) and never slows the process down.
    """

    def __init__(self, stream_id: Any, cursor: int, lossless: bool) -> None:
        self.id = stream_id
        self.cursor = cursor
        self.lossless = lossless
        self.credit = protocol.STREAM_WINDOW


class Capture:
    """The ``exec`` action's output: the first ``cap`` bytes of each stream, sent as read."""

    def __init__(self, req_id: Any, cap: int, started: float) -> None:
        self.req_id = req_id
        self.cap = cap
        self.started = started
        self.total = {STDOUT: 0, STDERR: 0}

    def keep(self, stream: str, data: bytes) -> bytes:
        """Count ``data``; the part of it that is still within the cap."""
        kept = min(self.total[stream], self.cap)
        self.total[stream] += len(data)
        return data[:max(0, self.cap - kept)]
