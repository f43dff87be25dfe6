"""Exceptions shared by every layer; the API maps each to an HTTP status."""

from __future__ import annotations


class ForkdError(Exception):
    """Base class. ``status`` is the HTTP status the API answers with; ``code``, where set, a
    machine-readable name of the error that the answer carries beside its message."""

    status = 500
    code: str | None = None


class InvalidRequest(ForkdError):
    status = 400


class NotFound(ForkdError):
    status = 404


class Conflict(ForkdError):
    status = 409


class NotHibernatable(Conflict):
    """A sandbox the hibernation design does not cover (live_fork, per_child_netns): 409 too,
    but unlike a busy one, trying again will not help."""


class TooLarge(ForkdError):
    """A request body (or an uploaded file) larger than the daemon accepts."""

    status = 413


class InsufficientStorage(ForkdError):
    """A write that would take a volume past its quota."""

    status = 507


class Busy(ForkdError):
    status = 503


NO_CAPACITY = "no_capacity"  # the code of a NoCapacity answer, which a fleet's gateway looks for


class NoCapacity(Busy):
    """This host holds as many sandboxes as it may (or is short of memory): a 503 whose answer
    says ``"code": "no_capacity"`` and when to try again (Retry-After), so a gateway tries another
    host and a client backs off."""

    code = NO_CAPACITY

    def __init__(self, message: str, *, retry_after_secs: int) -> None:
        super().__init__(message)
        self.retry_after_secs = retry_after_secs


class PrerequisiteMissing(ForkdError):
    """A host tool or package is missing; the message says what to install."""

    status = 500


class ImageError(ForkdError):
    status = 500


class VMError(ForkdError):
    """QEMU failed to start, boot, snapshot or restore."""

    status = 500


class CorruptState(VMError):
    """Saved state (a hibernation's files) that is not what was written: refused, never loaded."""

    status = 500


class BootTimeout(VMError):
    status = 504


class GuestError(ForkdError):
    """The guest agent could not be reached or answered with an error."""

    status = 502


class SandboxGone(GuestError):
    """A call or stream broke because its sandbox was killed or died while it ran."""


class IncompatibleSnapshot(ForkdError):
    """A snapshot made with another accelerator/CPU model cannot be restored here."""

    status = 409
