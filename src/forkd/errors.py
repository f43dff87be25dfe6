"""Exceptions shared by every layer; the API maps each to an HTTP status."""

from __future__ import annotations


class ForkdError(Exception):
    """Base class. ``status`` is the HTTP status the API answers with."""

    status = 500


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


class Busy(ForkdError):
    status = 503


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
