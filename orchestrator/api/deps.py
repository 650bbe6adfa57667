"""Shared dependencies of the routes: the app context and who the caller is.

Dependencies are ``async`` (they do no I/O): a sync one would cost a thread hop per request.

The auth rule, in one place:

- mutating admin endpoints (create, scale, stop, resume, delete runs) need the admin token;
- worker endpoints need that worker's token (registration: the run's join token or a launch token);
- read-only endpoints are public when ``public_reads`` is on (the default; they never return secrets),
  otherwise they need the admin token; a run's peers also accept its join token or a worker token
  of the run;
- checkpoint downloads always need the admin token, the run's join token or the worker token of a
  worker of the run that has not ended (launching, running or lost).

No token: 401. A token that matches nothing: 401. A valid token that does not grant the call (a join
or worker token on an admin endpoint, another worker's token): 403.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request
from fastapi import Path as PathParam
from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator import runs, tokens
from orchestrator.context import AppContext
from orchestrator.db.models import Run, Worker
from orchestrator.errors import Forbidden, Unauthorized
from orchestrator.schemas import ErrorOut

# Ids and cursors are 32-bit integer columns (PostgreSQL's integer): a larger number would reach the
# database driver and fail there (a 500) instead of being refused here (a 422).
MAX_ID = 2**31 - 1
WorkerId = Annotated[int, PathParam(ge=0, le=MAX_ID, description="The worker's id.")]

# Every error answer is ``{"detail": ...}`` (see app.py); documented on every API route so that the
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


async def get_ctx(request: Request) -> AppContext:
    ctx: AppContext = request.app.state.ctx
    return ctx


async def get_token(authorization: Annotated[str | None, Header()] = None) -> str | None:
    return tokens.bearer_token(authorization)


Ctx = Annotated[AppContext, Depends(get_ctx)]
Token = Annotated[str | None, Depends(get_token)]


def check_admin(ctx: AppContext, token: str | None) -> None:
    """Raise unless ``token`` is the admin token."""
    if token is None:
        raise Unauthorized("missing bearer token (admin token required)")
    if tokens.token_matches(token, ctx.admin_token_hash):
        return
    if token.startswith(tokens.NON_ADMIN_PREFIXES):
        raise Forbidden("this endpoint needs the admin token")
    raise Unauthorized("invalid token")


async def require_admin(ctx: Ctx, token: Token) -> None:
    check_admin(ctx, token)


async def require_reader(ctx: Ctx, token: Token) -> None:
    if not ctx.settings.public_reads:
        check_admin(ctx, token)


Admin = Annotated[None, Depends(require_admin)]
Reader = Annotated[None, Depends(require_reader)]


def check_run_access(ctx: AppContext, session: Session, run: Run, token: str | None) -> None:
    """Raise unless ``token`` is the admin token, ``run``'s join token or the token of one of its workers
    that has not ended."""
    if token is None:
        raise Unauthorized("missing bearer token")
    if tokens.token_matches(token, ctx.admin_token_hash) or tokens.token_matches(token, run.join_token_hash):
        return
    if token.startswith(tokens.WORKER_PREFIX):
        digest = tokens.hash_token(token)
        owner = session.execute(
            select(Worker.id, Worker.run_id, Worker.state).where(Worker.token_hash == digest)
        ).first()
        if owner is not None and owner.run_id != run.id:
            raise Forbidden(f"this worker token does not belong to run {run.name!r}")
        if owner is not None and owner.state not in runs.UNENDED_WORKER_STATES:
            raise Forbidden(f"worker {owner.id} has ended ({owner.state}); its token no longer grants access")
        if owner is not None:
            return
    if token.startswith(tokens.JOIN_PREFIX):
        if session.scalar(select(Run.id).where(Run.join_token_hash == tokens.hash_token(token))) is not None:
            raise Forbidden(f"this join token does not belong to run {run.name!r}")
    raise Unauthorized("invalid token")
