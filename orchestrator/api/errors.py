"""The one table from typed failures to HTTP statuses, the exception handlers that apply it, and the
error answers every API route documents.

Services raise the typed errors of ``orchestrator/errors.py`` (and a few of their own: a checkpoint file
missing from the store, the DHT not answering, the database unreachable); nothing else maps them. An
unexpected exception is logged with its traceback and answered 500 without one.
"""

from __future__ import annotations

import logging
import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from orchestrator import errors
from orchestrator.schemas import ErrorOut
from orchestrator.storage.base import CheckpointNotFound
from orchestrator.swarm.dht import DHTUnavailable

logger = logging.getLogger(__name__)

# The one table from typed failures to HTTP statuses (the most specific class is matched first).
ERROR_STATUS: dict[type[Exception], int] = {
    errors.Unauthorized: 401,
    errors.Forbidden: 403,
    errors.NotFound: 404,
    CheckpointNotFound: 404,
    errors.Conflict: 409,
    errors.ChecksumMismatch: 400,
    errors.InvalidRequest: 422,
    errors.PayloadTooLarge: 413,
    errors.Unavailable: 503,
    errors.InsufficientStorage: 507,
    errors.TooManyRequests: 429,
    DHTUnavailable: 503,
    OperationalError: 503,
    PoolTimeout: 503,  # every database connection busy: overload, not a fault
}
# When a 503 of the database asks the client to come back (``Retry-After``): the agent and the
# benchmark wait that long (and back off further) rather than give up.
DATABASE_RETRY_AFTER_S = 1


def _status_of(exc: Exception) -> int:
    for cls in type(exc).__mro__:
        if cls in ERROR_STATUS:
            return ERROR_STATUS[cls]
    return 500


def install_error_handlers(app: FastAPI) -> None:
    """Answer every failure as ``{"detail": ...}`` with the status of :data:`ERROR_STATUS`."""

    async def service_error(request: Request, exc: Exception) -> JSONResponse:  # noqa: ARG001 - FastAPI's handler signature
        status = _status_of(exc)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        if isinstance(exc, errors.TooManyRequests):
            headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
        detail = str(exc) if isinstance(exc, errors.ServiceError) else _generic_detail(exc)
        if isinstance(exc, CheckpointNotFound):
            detail = "checkpoint file missing from the store"
        return JSONResponse({"detail": detail}, status_code=status, headers=headers)

    async def database_error(request: Request, exc: Exception) -> JSONResponse:
        status = _status_of(exc)
        logger.error("%s %s: database error: %s", request.method, request.url.path, exc, exc_info=exc)
        unavailable = status == 503
        detail = "database unavailable, retry later" if unavailable else "internal database error"
        headers = {"Retry-After": str(DATABASE_RETRY_AFTER_S)} if unavailable else None
        return JSONResponse({"detail": detail}, status_code=status, headers=headers)

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.error("%s %s: unexpected error", request.method, request.url.path, exc_info=exc)
        return JSONResponse({"detail": "internal server error"}, status_code=500)

    async def validation(request: Request, exc: Exception) -> JSONResponse:  # noqa: ARG001 - FastAPI's handler signature
        assert isinstance(exc, RequestValidationError)
        details = [{k: v for k, v in e.items() if k in ("loc", "msg", "type")} for e in exc.errors()]
        return JSONResponse({"detail": details}, status_code=422)

    for cls in (errors.ServiceError, CheckpointNotFound, DHTUnavailable):
        app.add_exception_handler(cls, service_error)
    app.add_exception_handler(SQLAlchemyError, database_error)
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(Exception, unexpected)


def _generic_detail(exc: Exception) -> str:
    return "service unavailable, retry later" if _status_of(exc) == 503 else "request failed"


# Every error answer is ``{"detail": ...}``; documented on every API route so that the
# OpenAPI schema describes what clients can really receive (the fuzz tests check this).
ERROR_RESPONSES: dict[int | str, dict[str, object]] = {
    status: {"model": ErrorOut, "description": description}
    for status, description in (
        (400, "Malformed body or checksum mismatch"),
        (401, "Missing or unknown token"),
        (403, "The token does not grant this call"),
        (404, "Unknown run, worker or checkpoint"),
        (409, "Conflicts with the current state"),
        (413, "Body too large"),
        (422, "Invalid input"),
        (429, "Too many requests (a join token's registrations); retry after Retry-After seconds"),
        (500, "Unexpected server error (logged; never a traceback)"),
        (503, "Database or DHT unavailable; retry"),
        (507, "Too little free disk space for a checkpoint upload; retry"),
    )
}
