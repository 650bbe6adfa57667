"""Typed failures of the service layer. ``api/errors.py`` maps each class to an HTTP status in one table.

Raise the most specific class with a message a user can act on; the message is sent as ``detail``.
The reconciler catches these too (e.g. :class:`IllegalTransition` when a run was stopped meanwhile).
"""

from __future__ import annotations


class ServiceError(Exception):
    """Base of every expected failure; ``str(exc)`` is safe to show to the caller."""


class NotFound(ServiceError):
    """The run, worker or checkpoint does not exist."""


class Conflict(ServiceError):
    """The request is valid but clashes with the current state."""


class RunExists(Conflict):
    """A run with this name exists already."""


class IllegalTransition(Conflict):
    """The run or worker cannot go from its current state to the requested one."""


class RunNotAcceptingWorkers(Conflict):
    """A worker tried to join a run that is stopping or finished."""


class InvalidRequest(ServiceError):
    """The request is well-formed JSON but makes no sense (a count outside bounds, a bad import path)."""


class ChecksumMismatch(InvalidRequest):
    """Uploaded bytes do not match the announced SHA-256."""


class PayloadTooLarge(ServiceError):
    """The request body exceeds the configured limit."""


class Unauthorized(ServiceError):
    """No token, or a token that matches nothing."""


class Forbidden(ServiceError):
    """A valid token that does not grant this action (another worker's token, a join token on admin)."""


class Unavailable(ServiceError):
    """A dependency (database, DHT, import probe) cannot answer right now; retry later."""


class InsufficientStorage(Unavailable):
    """Too little free disk space to accept the upload now; retry later."""


class TooManyRequests(ServiceError):
    """The caller went over a rate limit; ``retry_after_s`` says when to try again."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
