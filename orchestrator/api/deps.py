"""Shared dependencies of the routes: the app context and who the caller is.

Dependencies are ``async`` (they do no I/O): a sync one would cost a thread hop per request.

The auth rule, in one place:

- mutating admin endpoints (create, scale, stop, resume, delete runs, replace a join token) need the
  admin token;
- worker endpoints need that worker's token (registration: the run's join token, a launch token or
  the worker's own token);
- read-only endpoints are public when ``public_reads`` is on (the default), otherwise they need the
  admin token; a run's peers also accept its join token or a worker token of the run. Anonymous reads
  get the public view: free-form values (spec args and options, launch details that locate a machine)
  are left out, and worker logs need the admin token;
- checkpoint downloads always need the admin token, the run's join token or the worker token of a
  worker of the run that has not ended (launching, running or lost).

No token: 401. A token that matches nothing: 401. A valid token that does not grant the call (a join
or worker token on an admin endpoint, another worker's token): 403. Authentication is a dependency of
each route, so FastAPI runs it before it validates the body: a caller without a valid token learns
nothing about what a valid body looks like.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request
from fastapi import Path as PathParam
from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator import tokens
from orchestrator.context import AppContext
from orchestrator.db.models import Run, Worker
from orchestrator.domain.states import UNENDED_WORKER_STATES
from orchestrator.errors import Forbidden, Unauthorized

# Ids and cursors are 32-bit integer columns (PostgreSQL's integer): a larger number would reach the
# database driver and fail there (a 500) instead of being refused here (a 422).
MAX_ID = 2**31 - 1
WorkerId = Annotated[int, PathParam(ge=0, le=MAX_ID, description="The worker's id.")]


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


async def require_reader(ctx: Ctx, token: Token) -> bool:
    """Whether the caller gets the full view (the admin token); raises when reads are private and the
    caller is not the admin. Any other token on a public read gets the public view."""
    if not ctx.settings.public_reads:
        check_admin(ctx, token)
        return True
    return token is not None and tokens.token_matches(token, ctx.admin_token_hash)


async def require_registration_token(token: Token) -> str:
    """The bearer token of a registration, if it is of a kind that can register (a join, launch or
    worker token)."""
    if token is None:
        raise Unauthorized("missing bearer token (the run's join token)")
    if not token.startswith(tokens.NON_ADMIN_PREFIXES):
        raise Unauthorized("registration needs the run's join token, a launch token or a worker token")
    return token


async def require_worker_token(token: Token) -> str:
    if token is None:
        raise Unauthorized("missing bearer token (the worker token)")
    return token


Admin = Annotated[None, Depends(require_admin)]
# True: the caller holds the admin token and gets the full view; False: the public view.
Reader = Annotated[bool, Depends(require_reader)]
RegistrationToken = Annotated[str, Depends(require_registration_token)]
WorkerToken = Annotated[str, Depends(require_worker_token)]


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
        if owner is not None and owner.state not in UNENDED_WORKER_STATES:
            raise Forbidden(f"worker {owner.id} has ended ({owner.state}); its token no longer grants access")
        if owner is not None:
            return
    if token.startswith(tokens.JOIN_PREFIX):
        if session.scalar(select(Run.id).where(Run.join_token_hash == tokens.hash_token(token))) is not None:
            raise Forbidden(f"this join token does not belong to run {run.name!r}")
    raise Unauthorized("invalid token")
