"""Shared dependencies of the routes: the running parts each route uses, and who the caller is.

Each route lists what it uses (``SettingsDep``, ``DatabaseDep``, ``ReadSession``, ``ClockDep``, ``HubDep``,
``StoreDep``, ...), never the whole context, so a test can replace one part with
``app.dependency_overrides``. Dependencies are ``async`` (they do no I/O): a sync one would cost a thread
hop per request. ``ReadSession`` is the exception: it runs in the thread pool, as the sync routes that
read the database do. Writes that change what workers are told (create, scale, stop, resume, delete a
run, revoke workers, a worker leaving, checkpoints) go through one use case (``UseCasesDep``,
``domain/usecases.py``), which owns its transaction and what follows the commit (deleting stored
files, then one "changed" signal that reloads the heartbeat cache); a registration goes through
``RegisteringDep`` (``domain/registration.py``: batched with the registrations arriving with it).

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

from collections.abc import Callable, Iterator, Mapping
from typing import Annotated, Any

from fastapi import Depends, Header, Request
from fastapi import Path as PathParam
from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator import tokens
from orchestrator.clock import Clock
from orchestrator.config import Settings
from orchestrator.context import AppContext
from orchestrator.db.batch import TransactionBatcher
from orchestrator.db.models import Run, Worker
from orchestrator.db.session import Database
from orchestrator.domain.checkpoints import UploadSlots
from orchestrator.domain.crash_budget import CrashPolicy
from orchestrator.domain.packages import PackageClaims
from orchestrator.domain.registration import Registering
from orchestrator.domain.states import UNENDED_WORKER_STATES
from orchestrator.domain.usecases import UseCases
from orchestrator.errors import Forbidden, Unauthorized
from orchestrator.heartbeats.hub import HeartbeatHub
from orchestrator.heartbeats.writer import HeartbeatWriter
from orchestrator.importcheck.checker import ImportChecker
from orchestrator.launchers.base import Launcher
from orchestrator.metrics.service import ServiceMetrics
from orchestrator.progress import SwarmProgressCache
from orchestrator.ratelimit import RateLimiter
from orchestrator.storage.base import CheckpointStore
from orchestrator.swarm.admission import SwarmAdmission
from orchestrator.swarm.dht import DHTPeer
from worker.protocol.validators import MAX_ID

# Ids and cursors are 32-bit integer columns (PostgreSQL's integer): a larger number would reach the
# database driver and fail there (a 500) instead of being refused here (a 422).
WorkerId = Annotated[int, PathParam(ge=0, le=MAX_ID, description="The worker's id.")]


# -- the running parts, one dependency each -------------------------------------------------------------
# Each route lists the parts it uses; all come from the AppContext that create_app's lifespan stores on
# app.state. A test can replace any one of them with app.dependency_overrides[get_<part>].


async def get_ctx(request: Request) -> AppContext:
    """The running orchestrator's parts (the root the dependencies below read from)."""
    ctx: AppContext = request.app.state.ctx
    return ctx


_Ctx = Annotated[AppContext, Depends(get_ctx)]


def _part(attribute: str, *, call: bool = False) -> Callable[[AppContext], Any]:
    """A dependency that gives one part of the app context: one function per part, so a route names
    only what it uses and a test can override that part alone (``app.dependency_overrides``)."""

    async def part(ctx: _Ctx) -> Any:
        value = getattr(ctx, attribute)
        return value() if call else value

    part.__name__ = part.__qualname__ = f"get_{attribute}"
    return part


get_settings = _part("settings")
get_database = _part("db")
get_clock = _part("clock")
get_hub = _part("hub")
get_heartbeat_writer = _part("heartbeat_writer")
get_store = _part("store")
get_swarm = _part("swarm")
get_dht = _part("dht")
get_own_peers = _part("orchestrator_peers", call=True)  # announce addresses first
get_swarm_reader = _part("read_swarm_now")  # blocking: call it off the event loop
get_heartbeat_settler = _part("settle_heartbeats")  # blocking too
get_imports = _part("imports")
get_launchers = _part("launchers")
get_admission = _part("swarm_admission")
get_join_limiter = _part("join_limiter")
get_registrations = _part("registrations")
get_uploads = _part("uploads")
get_package_claims = _part("package_claims")
get_crash_policy = _part("crash_policy")
get_admin_token_hash = _part("admin_token_hash")


def read_session(db: Annotated[Database, Depends(get_database)]) -> Iterator[Session]:
    """A read-only session, closed when the route returns (before the answer is sent)."""
    with db.read() as session:
        yield session


async def get_use_cases(
    db: Annotated[Database, Depends(get_database)],
    clock: Annotated[Clock, Depends(get_clock)],
    store: Annotated[CheckpointStore, Depends(get_store)],
    swarm: Annotated[SwarmProgressCache, Depends(get_swarm)],
    hub: Annotated[HeartbeatHub, Depends(get_hub)],
) -> UseCases:
    """The use cases over this app's parts; each signals "changed" by reloading the heartbeat cache (the
    one place the cache is told of a change made through the API)."""
    return UseCases(db, clock, store, swarm, changed=hub.refresh)


async def get_registering(
    db: Annotated[Database, Depends(get_database)],
    clock: Annotated[Clock, Depends(get_clock)],
    hub: Annotated[HeartbeatHub, Depends(get_hub)],
    settings: Annotated[Settings, Depends(get_settings)],
    batcher: Annotated[TransactionBatcher, Depends(get_registrations)],
    join_limiter: Annotated[RateLimiter | None, Depends(get_join_limiter)],
    admission: Annotated[SwarmAdmission | None, Depends(get_admission)],
) -> Registering:
    """Registration over this app's parts: the batcher registrations share, the join tokens' limiter,
    the heartbeat cache a new worker goes into and, under swarm admission, the DHT peer's open swarms."""
    return Registering(db, batcher, clock, hub, settings.heartbeat_interval_s, join_limiter, admission)


async def get_metrics(request: Request) -> ServiceMetrics:
    """The app's own Prometheus registry (made by create_app, outside the lifespan)."""
    metrics: ServiceMetrics = request.app.state.metrics
    return metrics


SettingsDep = Annotated[Settings, Depends(get_settings)]
DatabaseDep = Annotated[Database, Depends(get_database)]
ReadSession = Annotated[Session, Depends(read_session, scope="function")]
ClockDep = Annotated[Clock, Depends(get_clock)]
HubDep = Annotated[HeartbeatHub, Depends(get_hub)]
HeartbeatWriterDep = Annotated[HeartbeatWriter, Depends(get_heartbeat_writer)]
StoreDep = Annotated[CheckpointStore, Depends(get_store)]
SwarmDep = Annotated[SwarmProgressCache, Depends(get_swarm)]
DhtDep = Annotated[DHTPeer, Depends(get_dht)]
OwnPeers = Annotated[list[str], Depends(get_own_peers)]
SwarmReader = Annotated[Callable[[int], None], Depends(get_swarm_reader)]
HeartbeatSettler = Annotated[Callable[[int], None], Depends(get_heartbeat_settler)]
ImportsDep = Annotated[ImportChecker | None, Depends(get_imports)]
PackageClaimsDep = Annotated[PackageClaims, Depends(get_package_claims)]
LaunchersDep = Annotated[Mapping[str, Launcher], Depends(get_launchers)]
AdmissionDep = Annotated[SwarmAdmission | None, Depends(get_admission)]
UploadsDep = Annotated[UploadSlots, Depends(get_uploads)]
CrashPolicyDep = Annotated[CrashPolicy, Depends(get_crash_policy)]
AdminTokenHash = Annotated[str, Depends(get_admin_token_hash)]
MetricsDep = Annotated[ServiceMetrics, Depends(get_metrics)]
UseCasesDep = Annotated[UseCases, Depends(get_use_cases)]
RegisteringDep = Annotated[Registering, Depends(get_registering)]


# -- the caller -----------------------------------------------------------------------------------------


async def get_token(authorization: Annotated[str | None, Header()] = None) -> str | None:
    return tokens.bearer_token(authorization)


Token = Annotated[str | None, Depends(get_token)]


def check_admin(admin_token_hash: str, token: str | None) -> None:
    """Raise unless ``token`` is the admin token."""
    if token is None:
        raise Unauthorized("missing bearer token (admin token required)")
    if tokens.token_matches(token, admin_token_hash):
        return
    if token.startswith(tokens.NON_ADMIN_PREFIXES):
        raise Forbidden("this endpoint needs the admin token")
    raise Unauthorized("invalid token")


def is_admin(admin_token_hash: str, token: str | None) -> bool:
    """Whether ``token`` is the admin token (no token: False)."""
    return token is not None and tokens.token_matches(token, admin_token_hash)


async def require_admin(admin_token_hash: AdminTokenHash, token: Token) -> None:
    check_admin(admin_token_hash, token)


async def require_reader(settings: SettingsDep, admin_token_hash: AdminTokenHash, token: Token) -> bool:
    """Whether the caller gets the full view (the admin token); raises when reads are private and the
    caller is not the admin. Any other token on a public read gets the public view."""
    if not settings.public_reads:
        check_admin(admin_token_hash, token)
        return True
    return is_admin(admin_token_hash, token)


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


def check_run_access(admin_token_hash: str, session: Session, run: Run, token: str | None) -> None:
    """Raise unless ``token`` is the admin token, ``run``'s join token or the token of one of its workers
    that has not ended."""
    if token is None:
        raise Unauthorized("missing bearer token")
    if tokens.token_matches(token, admin_token_hash) or tokens.token_matches(token, run.join_token_hash):
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
    if (
        token.startswith(tokens.JOIN_PREFIX)
        and session.scalar(select(Run.id).where(Run.join_token_hash == tokens.hash_token(token))) is not None
    ):
        raise Forbidden(f"this join token does not belong to run {run.name!r}")
    raise Unauthorized("invalid token")
