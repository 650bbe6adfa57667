"""``create_app(settings)``: the orchestrator's one composition root. Every part is built and wired here.

Production defaults, each replaceable by a keyword (tests pass their own):

- launchers: ``local`` always (workers are subprocesses of this machine, logs in the data dir), and
  ``ec2`` when ``SPOTSWARM_EC2_LAUNCH_TEMPLATE`` is set (the Terraform module sets it);
- checkpoint store: S3 when ``SPOTSWARM_S3_BUCKET`` is set, else ``<data_dir>/checkpoints``;
- the DHT peer: a hivemind DHT in its own process, with the peer authorizer under swarm admission.

Nothing starts until the ASGI lifespan runs (uvicorn does that). Lifespan, in order: the admin token
(read, or generated into the data dir when unset), the DHT peer (first, so its process forks before any
thread exists), the database (migrations run at start-up), the heartbeat hub, the import probe (warmed
in the background), then the background services: the heartbeat flusher, the DHT progress reader, the
sync of opted-out runs to the DHT peer (under swarm admission) and the reconcile loop (unless
``reconcile`` is off). They stop in reverse order; the flusher writes what it holds before the database
closes.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from orchestrator.api.errors import ERROR_RESPONSES, install_error_handlers
from orchestrator.api.middleware.body_limit import BodyLimitMiddleware
from orchestrator.api.middleware.trusted_hosts import TrustedHostMiddleware
from orchestrator.api.routes import (
    checkpoints,
    health,
    packages,
    peers,
    runs,
    swarm_tokens,
    worker_logs,
    workers,
)
from orchestrator.api.routes import metrics as metrics_api
from orchestrator.background import BackgroundService, PeriodicService
from orchestrator.clock import Clock, utc_now
from orchestrator.config import Settings, ensure_admin_token
from orchestrator.context import AppContext
from orchestrator.db.session import Database
from orchestrator.domain.deployment_facts import claim_authority
from orchestrator.domain.packages import sweep_orphans
from orchestrator.heartbeats.fast_path import HeartbeatFastPath
from orchestrator.heartbeats.hub import HeartbeatHub
from orchestrator.heartbeats.writer import HeartbeatWriter
from orchestrator.importcheck.checker import ImportChecker, RuntimeLimits
from orchestrator.launchers.base import Launcher
from orchestrator.launchers.childenv import child_env
from orchestrator.launchers.forkserver import ForkServer
from orchestrator.launchers.local import LocalLauncher
from orchestrator.metrics.middleware import RequestMetricsMiddleware
from orchestrator.metrics.service import ServiceMetrics
from orchestrator.metrics.tensorboard import TensorBoardForwarder
from orchestrator.progress import SwarmProgressCache
from orchestrator.ratelimit import RateLimiter
from orchestrator.reconciler.leader import leader_election
from orchestrator.reconciler.loop import Reconciler
from orchestrator.reconciler.service import ReconcilerService
from orchestrator.storage.base import CheckpointStore
from orchestrator.swarm.admission import SwarmAdmission, SwarmAuthority
from orchestrator.swarm.dht import DHTPeer, OrchestratorDHT, refresh_progress
from orchestrator.tokens import hash_token
from orchestrator.web import docs_router
from orchestrator.web import router as web_router
from worker.protocol.paths import API_PREFIX, ApiPath, path_regex

logger = logging.getLogger(__name__)

#: Starts the orchestrator's DHT peer: given the settings and, under swarm admission, the authority its
#: peer authorizer signs with (None: no admission) and the opted-out runs it serves from the start.
#: Returns the running peer.
DhtFactory = Callable[[Settings, SwarmAuthority | None, frozenset[str]], DHTPeer]


def create_app(
    settings: Settings,
    *,
    launchers: Mapping[str, Launcher] | None = None,
    store: CheckpointStore | None = None,
    dht_factory: DhtFactory | None = None,
    clock: Clock = utc_now,
) -> FastAPI:
    """Build the orchestrator's app; nothing starts until its lifespan runs.

    ``launchers`` (by name) are the launchers runs may name (default: :func:`build_launchers`);
    ``store`` holds checkpoints and code packages (default: :func:`build_store`); ``dht_factory`` starts
    the DHT peer (default: :func:`start_dht`). Defaults are built when the lifespan starts.
    """
    metrics = ServiceMetrics()  # this app's own registry (never the global one)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # one process with Lightning imported, for the import check and the local launcher's workers
        forkserver = ForkServer(child_env(os.environ, settings.worker_env), Path.cwd())
        if _uses_forkserver(settings):  # its imports take seconds: started first, beside the rest
            threading.Thread(target=forkserver.warm_up, name="forkserver-start", daemon=True).start()
        chosen = launchers if launchers is not None else build_launchers(settings, forkserver)
        counted = metrics.count_launches(chosen)
        ctx = _build_context(settings, counted, store, dht_factory or start_dht, clock, forkserver)
        app.state.ctx = ctx
        services, reconcilers = _services(ctx)
        started = await _start(services)
        metrics.attach(ctx, reconcilers)
        logger.info(
            "orchestrator ready on %s:%d (database: %s)", settings.host, settings.port, ctx.db.dialect
        )
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
    install_error_handlers(app)
    for module in (runs, workers, checkpoints, packages, peers, worker_logs, swarm_tokens):
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
            (path_regex(ApiPath.checkpoint_upload), settings.checkpoint_max_bytes),
            (path_regex(ApiPath.package), settings.package_max_bytes),
        ],
    )
    app.add_middleware(HeartbeatFastPath, hub_of=lambda: _hub(app), max_body_bytes=settings.max_body_bytes)
    # Before every route and the heartbeat's fast path: no answer to a host the API is not served as.
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=settings.allowed_hosts())
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)  # outermost: 413s are timed too
    return app


# -- production defaults --------------------------------------------------------------------------------


def _uses_forkserver(settings: Settings) -> bool:
    """Whether this server will soon need its fork server: for the import check of the first run it is
    given, or for the first local workers its reconcile loop launches. Then it starts with the server,
    so that neither waits the seconds of its imports; a server of hand-joined workers only never starts
    it."""
    return settings.check_imports or (settings.reconciler.enabled and settings.local_preload)


def build_launchers(settings: Settings, forkserver: ForkServer | None = None) -> dict[str, Launcher]:
    """The launchers this orchestrator offers, by name (the local one forks from ``forkserver``)."""
    local = LocalLauncher(
        settings.data_dir,
        grace_s=settings.reconciler.retire_grace_s,
        pass_env=settings.worker_env,
        preload=settings.local_preload,
        forkserver=forkserver,
    )
    launchers: dict[str, Launcher] = {"local": local}
    if settings.local_spot_market is not None:
        from orchestrator.launchers.spot_local import SpotMarketLauncher, load_market_settings
        from orchestrator.launchers.spot_market import SpotMarket

        market = SpotMarket(load_market_settings(settings.local_spot_market), time.time)
        launchers["local"] = SpotMarketLauncher(local, market, time.time)
    if settings.ec2.launch_template:
        from orchestrator.launchers.ec2.launcher import Ec2Launcher  # imports boto3

        launchers["ec2"] = Ec2Launcher(settings.ec2)
    return launchers


def build_store(settings: Settings) -> CheckpointStore:
    """S3 when a bucket is configured, else the local checkpoint directory."""
    s3 = settings.s3
    if s3.bucket:
        from orchestrator.storage.s3 import S3Store, S3StoreConfig  # imports boto3

        region = s3.region or settings.ec2.region
        return S3Store(
            S3StoreConfig(bucket=s3.bucket, prefix=s3.prefix, region=region, endpoint_url=s3.endpoint_url)
        )
    from orchestrator.storage.local import LocalCheckpointStore

    return LocalCheckpointStore(settings.resolved_checkpoint_dir())


def start_dht(
    settings: Settings, authority: SwarmAuthority | None, open_swarms: frozenset[str] = frozenset()
) -> OrchestratorDHT:
    """The orchestrator's DHT peer, started; under swarm admission with its peer authorizer, already
    serving the token-less peers of ``open_swarms``."""
    options: dict[str, Any] | None = None
    if authority is not None:
        from orchestrator.swarm.peer_authorizer import peer_dht_options  # imports hivemind

        options = peer_dht_options(authority, settings.dht_identity_path(), open_swarms)
    dht = OrchestratorDHT(
        settings.dht_identity_path(),
        settings.dht_pid_path(),
        settings.dht.resolved_host_maddrs(),
        settings.dht.announce_maddrs,
        dht_options=options,
    )
    dht.start()
    return dht


def public_url(settings: Settings) -> str:
    """The URL workers use to reach the API: the configured one, else the bind address."""
    if settings.public_url:
        return settings.public_url.rstrip("/")
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    return f"http://{host}:{settings.port}"


# -- the lifespan -----------------------------------------------------------------------------------------


def _hub(app: FastAPI) -> HeartbeatHub | None:
    """The running app's heartbeat hub (None outside its lifespan)."""
    ctx: AppContext | None = getattr(app.state, "ctx", None)
    return ctx.hub if ctx is not None else None


def _build_context(
    settings: Settings,
    launchers: Mapping[str, Launcher],
    store: CheckpointStore | None,
    dht_factory: DhtFactory,
    clock: Clock,
    forkserver: ForkServer,
) -> AppContext:
    """The running parts: admin token, DHT peer, database (migrated), hub, import probe, store."""
    _private_data_dir(settings.data_dir)
    admin_token, generated = ensure_admin_token(settings)
    if not generated and settings.admin_token is None:
        logger.info("admin token: read from %s", settings.admin_token_path())
    admission = (
        SwarmAdmission.from_key_file(settings.swarm_authority_key_path(), settings.swarm_token_ttl_s)
        if settings.swarm_admission
        else None
    )
    db = Database(settings.resolved_database_url())
    try:
        db.upgrade()
        open_swarms: frozenset[str] = frozenset()
        if admission is not None:
            claim_authority(db, admission.authority.public_key, settings.swarm_authority_key_path())
            open_swarms = admission.serve_from_start(db)
        # the DHT peer starts knowing which runs opted out of admission: it refuses none of their peers
        dht = dht_factory(settings, admission.authority if admission else None, open_swarms)
    except BaseException:
        db.close()
        raise
    if admission is not None:
        admission.bind_peer(functools.partial(_push_open_swarms, dht, timeout_s=settings.dht.timeout_s))
    swarm = SwarmProgressCache()
    forwarder = TensorBoardForwarder(settings.tensorboard_dir) if settings.tensorboard_dir else None
    hub = HeartbeatHub(db, settings, clock, swarm)
    hub.refresh()
    writer = HeartbeatWriter(hub, db, settings, clock, swarm, forwarder)
    imports = None
    if settings.check_imports:
        limits = RuntimeLimits(settings.installer, settings.install_timeout_s, settings.package_max_bytes)
        imports = ImportChecker(settings.import_timeout_s, settings.worker_env, limits, forkserver)
    return AppContext(
        settings=settings,
        db=db,
        clock=clock,
        dht=dht,
        swarm=swarm,
        hub=hub,
        heartbeat_writer=writer,
        store=store if store is not None else build_store(settings),
        imports=imports,
        admin_token_hash=hash_token(admin_token),
        launchers=dict(launchers),
        swarm_admission=admission,
        join_limiter=RateLimiter(settings.join_rate_per_s, settings.join_burst),
        forwarder=forwarder,
    )


def _services(ctx: AppContext) -> tuple[list[BackgroundService], list[Reconciler]]:
    """The background services over ``ctx``, in start order, and the reconcilers among them."""
    settings = ctx.settings
    services: list[BackgroundService] = [
        PeriodicService(
            "heartbeat-flush",
            settings.heartbeat_flush_interval_s,
            ctx.heartbeat_writer.flush,
            final_tick=True,
        ),
        PeriodicService(
            "swarm-progress", settings.dht.refresh_interval_s, functools.partial(_read_swarms, ctx)
        ),
    ]
    sweep = functools.partial(_sweep_packages, ctx)
    services.append(PeriodicService("package-sweep", settings.package_sweep_interval_s, sweep))
    if ctx.swarm_admission is not None:
        sync = functools.partial(ctx.swarm_admission.sync_open_swarms, ctx.db)
        services.append(PeriodicService("swarm-admission", settings.dht.refresh_interval_s, sync))
    reconcilers = []
    if settings.reconciler.enabled:
        swarm_epoch = functools.partial(_swarm_epoch, ctx.swarm)
        reconciler = Reconciler(
            ctx.db, ctx.launchers, public_url(settings), settings.reconciler, ctx.clock, swarm_epoch
        )
        reconcilers.append(reconciler)
        services.append(
            ReconcilerService(reconciler, settings.reconciler.interval_s, leader_election(ctx.db.url))
        )
    return services, reconcilers


def _sweep_packages(ctx: AppContext) -> None:
    """Delete code packages no run names, older than the grace period (at start, then periodically)."""
    grace_s = ctx.settings.package_orphan_grace_s
    sweep_orphans(ctx.db, ctx.store, ctx.package_claims, ctx.clock(), grace_s)


async def _start(services: list[BackgroundService]) -> list[BackgroundService]:
    started: list[BackgroundService] = []
    for service in services:
        await service.start()
        started.append(service)
    return started


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
    refresh_progress(ctx.dht, ctx.swarm, swarms, ctx.settings.dht.timeout_s, ctx.clock)
    ctx.swarm.forget_except(set(swarms))


def _swarm_epoch(swarm: SwarmProgressCache, swarm_id: str) -> int | None:
    progress = swarm.get(swarm_id)
    return progress.epoch if progress is not None else None


def _push_open_swarms(dht: DHTPeer, swarms: frozenset[str], timeout_s: float) -> None:
    """Hand the set of opted-out runs' swarms to the peer authorizer in the DHT's process (raises
    ``DHTUnavailable`` when the peer is down or does not answer within ``timeout_s``)."""
    from orchestrator.swarm.peer_authorizer import push_open_swarms  # imports hivemind

    push_open_swarms(dht, swarms, timeout_s)


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
