"""``create_app(settings)``: the FastAPI application, its lifespan and its one error-mapping table.

Lifespan, in order: the admin token (generated into the data dir when unset), the DHT peer (first, so
its process forks before any thread exists), the database (migrations run at start-up), the heartbeat
hub, the import probe (warmed in the background), then the background services: the heartbeat flusher,
the DHT progress reader, and whatever ``services`` factories the caller adds (the reconciler). They
stop in reverse order; the flusher writes what it holds before the database closes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from orchestrator import errors
from orchestrator.api import checkpoints, health, packages, peers, runs, swarm_auth, worker_logs, workers
from orchestrator.api import metrics as metrics_api
from orchestrator.api.deps import ERROR_RESPONSES
from orchestrator.bodylimit import BodyLimitMiddleware
from orchestrator.clock import Clock, utc_now
from orchestrator.config import Settings, ensure_admin_token
from orchestrator.context import AppContext, BackgroundService, PeriodicService, ServiceFactory
from orchestrator.db.session import Database
from orchestrator.deployment_facts import claim_authority
from orchestrator.dht import DHTUnavailable, OrchestratorDHT, SwarmProgressCache, refresh_progress
from orchestrator.forwarding import TensorBoardForwarder
from orchestrator.heartbeat_fastpath import HeartbeatFastPath
from orchestrator.heartbeats import HeartbeatHub
from orchestrator.importcheck import ImportChecker, RuntimeLimits
from orchestrator.launchers.base import Launcher
from orchestrator.metrics import RequestMetricsMiddleware, ServiceMetrics
from orchestrator.ratelimit import RateLimiter
from orchestrator.storage.base import CheckpointNotFound, CheckpointStore
from orchestrator.storage.local import LocalCheckpointStore
from orchestrator.swarm_auth import SwarmAdmission
from orchestrator.tokens import hash_token
from orchestrator.web import docs_router
from orchestrator.web import router as web_router

logger = logging.getLogger(__name__)
API_PREFIX = "/api/v1"

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
}


def _status_of(exc: Exception) -> int:
    for cls in type(exc).__mro__:
        if cls in ERROR_STATUS:
            return ERROR_STATUS[cls]
    return 500


def _install_error_handlers(app: FastAPI) -> None:
    async def service_error(request: Request, exc: Exception) -> JSONResponse:
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
        detail = "database unavailable, retry later" if status == 503 else "internal database error"
        return JSONResponse({"detail": detail}, status_code=status)

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.error("%s %s: unexpected error", request.method, request.url.path, exc_info=exc)
        return JSONResponse({"detail": "internal server error"}, status_code=500)

    async def validation(request: Request, exc: Exception) -> JSONResponse:
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


def create_app(
    settings: Settings,
    *,
    launchers: Mapping[str, Launcher] | None = None,
    clock: Clock = utc_now,
    services: Sequence[ServiceFactory] = (),
    store_factory: Callable[[Settings], CheckpointStore] | None = None,
) -> FastAPI:
    """Build the app. Nothing starts until the ASGI lifespan runs (uvicorn does that).

    ``launchers`` (by name) restricts the launchers a run may name and is handed to services;
    ``services`` are factories of extra background services (e.g. the reconciler) given the context;
    ``store_factory`` replaces the local checkpoint directory (e.g. with S3).
    """

    metrics = ServiceMetrics()  # this app's own registry (never the global one)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        counted = metrics.count_launches(launchers or {})
        ctx, started = await _start(settings, counted, clock, services, store_factory)
        app.state.ctx = ctx
        metrics.attach(ctx, started)
        try:
            yield
        finally:
            metrics.detach(ctx.db)
            await _stop(ctx, started)

    app = FastAPI(
        title="spotswarm orchestrator",
        version="0.1.0",
        summary="Elastic PyTorch Lightning training over hivemind on unreliable machines.",
        lifespan=lifespan,
        docs_url=None,  # served by orchestrator.web.apidocs, without a CDN
        redoc_url=None,
    )
    _install_error_handlers(app)
    for module in (runs, workers, checkpoints, packages, peers, worker_logs, swarm_auth):
        app.include_router(module.router, prefix=API_PREFIX, responses=ERROR_RESPONSES)
    app.include_router(health.router)
    app.include_router(metrics_api.router, responses=ERROR_RESPONSES)  # /metrics (Prometheus)
    app.state.metrics = metrics
    app.include_router(web_router)  # the status page: /, /runs/{name}, /static/*
    app.include_router(docs_router)  # /docs, /redoc and their assets
    app.add_middleware(
        BodyLimitMiddleware,
        max_body_bytes=settings.max_body_bytes,
        upload_limits=[
            (rf"^{API_PREFIX}/workers/[^/]+/checkpoints/[^/]+$", settings.checkpoint_max_bytes),
            (rf"^{API_PREFIX}/packages/[^/]+$", settings.package_max_bytes),
        ],
    )
    app.add_middleware(HeartbeatFastPath, hub_of=lambda: _hub(app), max_body_bytes=settings.max_body_bytes)
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)  # outermost: 413s are timed too
    return app


def _hub(app: FastAPI) -> HeartbeatHub | None:
    """The running app's heartbeat hub (None outside its lifespan)."""
    ctx: AppContext | None = getattr(app.state, "ctx", None)
    return ctx.hub if ctx is not None else None


async def _start(
    settings: Settings,
    launchers: Mapping[str, Launcher],
    clock: Clock,
    factories: Sequence[ServiceFactory],
    store_factory: Callable[[Settings], CheckpointStore] | None,
) -> tuple[AppContext, list[BackgroundService]]:
    _private_data_dir(settings.data_dir)
    admin_token, generated = ensure_admin_token(settings)
    if generated:
        # Only where it is: the token itself must not end up in journald or `docker logs`.
        path = settings.admin_token_path()
        print(f"spotswarm admin token: generated into {path} (read it with: cat {path})", flush=True)
    elif settings.admin_token is None:
        logger.info("admin token: read from %s", settings.admin_token_path())
    admission = (
        SwarmAdmission.from_key_file(settings.swarm_authority_key_path(), settings.swarm_token_ttl_s)
        if settings.swarm_admission
        else None
    )
    db = Database(settings.resolved_database_url())
    try:
        db.upgrade()
        if admission is not None:
            claim_authority(db, admission.authority.public_key, settings.swarm_authority_key_path())
        # the DHT peer starts knowing which runs opted out of admission: it refuses none of their peers
        dht = OrchestratorDHT(
            settings.dht_identity_path(),
            settings.dht_pid_path(),
            settings.resolved_dht_host_maddrs(),
            settings.dht_announce_maddrs,
            dht_options=admission.dht_options(settings.dht_identity_path(), db) if admission else None,
        )
        dht.start()
    except BaseException:
        db.close()
        raise
    swarm = SwarmProgressCache()
    forwarder = TensorBoardForwarder(settings.tensorboard_dir) if settings.tensorboard_dir else None
    hub = HeartbeatHub(db, settings, clock, swarm, forwarder)
    hub.refresh()
    limits = RuntimeLimits(settings.installer, settings.install_timeout_s, settings.package_max_bytes)
    imports = None
    if settings.check_imports:
        imports = ImportChecker(settings.import_timeout_s, settings.worker_env, limits)
    if imports is not None:
        imports.warm_up()
    store = (
        store_factory(settings) if store_factory else LocalCheckpointStore(settings.resolved_checkpoint_dir())
    )
    ctx = AppContext(
        settings=settings,
        db=db,
        clock=clock,
        dht=dht,
        swarm=swarm,
        hub=hub,
        store=store,
        imports=imports,
        admin_token_hash=hash_token(admin_token),
        launchers=dict(launchers),
        swarm_admission=admission,
        join_limiter=RateLimiter(settings.join_rate_per_s, settings.join_burst),
        forwarder=forwarder,
    )
    services: list[BackgroundService] = [
        PeriodicService("heartbeat-flush", settings.heartbeat_flush_interval_s, hub.flush, final_tick=True),
        PeriodicService("swarm-progress", settings.dht_refresh_interval_s, lambda: _read_swarms(ctx)),
    ]
    if admission is not None:
        services.append(admission.sync_service(ctx))
    services.extend(factory(ctx) for factory in factories)
    started: list[BackgroundService] = []
    for service in services:
        await service.start()
        started.append(service)
    logger.info("orchestrator ready on %s:%d (database: %s)", settings.host, settings.port, db.dialect)
    return ctx, started


def _private_data_dir(data_dir: Path) -> None:
    """Create the data dir owner-only (0700); warn when an existing one is open to other users."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if data_dir.stat().st_mode & 0o077:
        logger.warning(
            "data dir %s is readable by other users (run specs, checkpoints, worker logs): chmod 700 it",
            data_dir,
        )


def _read_swarms(ctx: AppContext) -> None:
    swarms = ctx.hub.active_swarms()
    if not swarms:
        return
    refresh_progress(ctx.dht, ctx.swarm, swarms, ctx.settings.dht_timeout_s, ctx.clock)
    ctx.swarm.forget_except(set(swarms))


async def _stop(ctx: AppContext, started: list[BackgroundService]) -> None:
    for service in reversed(started):
        await service.stop()
    if ctx.imports is not None:
        ctx.imports.close()
    if ctx.forwarder is not None:  # after the flusher's final tick
        ctx.forwarder.close()
    ctx.dht.shutdown()
    ctx.db.close()
    logger.info("orchestrator stopped")
