"""Exceptions raised by the SDK.

Every class derives from :class:`forkd.errors.ForkdError`, so code that already
catches the core library's errors also catches the SDK's. HTTP failures are
:class:`ForkdAPIError` subclasses picked by status code; transport failures are
:class:`ForkdConnectionError` / :class:`ForkdTimeoutError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from forkd.errors import ForkdError

if TYPE_CHECKING:
    from forkd.sdk.types import ForkResult, Outcome


class ForkdAPIError(ForkdError):
    """The daemon answered with an error status.

    ``status`` is the HTTP status, ``message`` the server's ``{"error": ...}`` text.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status}, message={self.message!r})"


class BadRequest(ForkdAPIError):
    """400 (or 422): the request was malformed or asked for something invalid."""


class Unauthorized(ForkdAPIError):
    """401/403: missing or wrong bearer token (set ``FORKD_TOKEN`` or ``FORKD_TOKEN_FILE``)."""


class NotFoundError(ForkdAPIError):
    """404: no such snapshot tag or sandbox id."""


class ConflictError(ForkdAPIError):
    """409: the tag already exists, a branch for it is in flight, or the snapshot is in use."""


class ServerError(ForkdAPIError):
    """5xx: the daemon failed (VM boot/restore/snapshot, guest agent, ...)."""


class ServiceUnavailable(ServerError):
    """503: the daemon is at a concurrency cap; retry after a short delay."""


class NoCapacityError(ServiceUnavailable):
    """503 with ``code: "no_capacity"``: the host (or, through a gateway, every host of the fleet) holds
    as many sandboxes as it may, or is short of memory. ``retry_after`` is the server's Retry-After in
    seconds (None if it sent none): try again then, or free a sandbox first."""

    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(status, message)
        self.retry_after = retry_after


class ForkdConnectionError(ForkdError):
    """The daemon could not be reached at all (refused, DNS, TLS, connect timeout)."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(
            f"forkd daemon is not reachable at {url} ({reason}). "
            "Start it with `forkd daemon`, or point FORKD_URL at the address it listens on."
        )
        self.url = url
        self.reason = reason


class ForkdTimeoutError(ForkdError, TimeoutError):
    """A request, or a wait such as :meth:`Controller.wait_snapshot_ready`, took too long."""


class SnapshotFailedError(ForkdError):
    """A snapshot that was being written in the background ended with ``status: "failed"``."""

    def __init__(self, tag: str, reason: str | None = None) -> None:
        detail = f": {reason}" if reason else ""
        super().__init__(f"snapshot {tag!r} failed{detail}")
        self.tag = tag
        self.reason = reason


class ExploreError(ForkdError):
    """No candidate of :meth:`Sandbox.explore <forkd.sdk.Sandbox.explore>` succeeded.

    Every child failed to spawn, run or be scored; explore killed the children
    that had come up. ``outcomes`` says how each candidate failed (``error``,
    ``exception``), ``fork`` is the fork-tree they came from.
    """

    def __init__(
        self,
        message: str,
        outcomes: Sequence[Outcome[Any, Any]],
        fork: ForkResult[Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.outcomes = list(outcomes)
        self.fork = fork


_BY_STATUS: dict[int, type[ForkdAPIError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Unauthorized,
    404: NotFoundError,
    409: ConflictError,
    # FastAPI's own body validation answers 422; to a caller it is a bad request.
    422: BadRequest,
    503: ServiceUnavailable,
}


def error_for_status(status: int, message: str, code: str | None = None,
                     retry_after: float | None = None) -> ForkdAPIError:
    """The most specific :class:`ForkdAPIError` for an HTTP ``status`` and the answer's ``code``."""
    if status == 503 and code == "no_capacity":
        return NoCapacityError(status, message, retry_after)
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else ForkdAPIError
    return cls(status, message)


__all__ = [
    "BadRequest",
    "ConflictError",
    "ExploreError",
    "ForkdAPIError",
    "ForkdConnectionError",
    "ForkdTimeoutError",
    "NoCapacityError",
    "NotFoundError",
    "ServerError",
    "ServiceUnavailable",
    "SnapshotFailedError",
    "Unauthorized",
    "error_for_status",
]
