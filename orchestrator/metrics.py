"""Prometheus metrics of the orchestrator, served at ``GET /metrics`` in the Prometheus text format.

Two kinds, in one :class:`prometheus_client.CollectorRegistry` per app (never the global one: a test
process starts many apps):

- **Service counters and histograms**, updated as things happen: request latency by route template and
  status (:class:`RequestMetricsMiddleware`), heartbeats accepted/rejected (derived from the heartbeat
  route's status), launches, terminations and launch failures per launcher (:class:`CountedLauncher`
  wraps each launcher), database errors (an engine ``handle_error`` hook).
- **Current values read at scrape time** by :class:`OrchestratorCollector` from the database, the DHT
  progress cache and the reconciler: one set of series per run (workers by state, swarm epoch, samples,
  loss, DHT peers, checkpoints, cost). A deleted run's series disappear with it.

Label values are bounded: run names, launcher names, states, route templates, HTTP status codes. Never
a worker id, a request path or a message. The metric names are listed in docs/readme/operability.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import event, func, select
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator import queries
from orchestrator.context import AppContext, BackgroundService
from orchestrator.db.models import Checkpoint, Run, Worker
from orchestrator.db.session import Database
from orchestrator.launchers.base import Instance, Launcher, LauncherConfigError, LaunchFailure, LaunchRequest
from worker.wire import RunState, WorkerState

logger = logging.getLogger(__name__)

HEARTBEAT_ROUTE = "/api/v1/workers/{worker_id}/heartbeat"
UNMATCHED_ROUTE = "unmatched"  # 404s of paths no route knows: one label value, whatever the path
PRICE_KEYS = ("price_usd_per_hour", "price_per_hour")
REQUEST_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServiceMetrics:
    """The registry of one app and its service counters; :meth:`attach` adds the scrape-time collector."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.request_seconds = Histogram(
            "spotswarm_http_request_duration_seconds",
            "HTTP request latency by route template, method and status (until the response is sent).",
            ["route", "method", "status"],
            buckets=REQUEST_BUCKETS_S,
            registry=r,
        )
        self.heartbeats = Counter(
            "spotswarm_heartbeats",
            "Worker heartbeats: accepted (2xx), rejected (4xx: auth, unknown worker, bad body), error (5xx).",
            ["result"],
            registry=r,
        )
        self.launches = Counter(
            "spotswarm_launches",
            "Workers the reconcile loop asked a launcher to start.",
            ["launcher"],
            registry=r,
        )
        self.terminations = Counter(
            "spotswarm_terminations",
            "Workers the reconcile loop asked a launcher to stop.",
            ["launcher"],
            registry=r,
        )
        self.launch_failures = Counter(
            "spotswarm_launch_failures",
            "Launch failures: rejected (the launcher refused the request) or reported (a worker that could "
            "not start or died, as the launcher reports it).",
            ["launcher", "kind"],
            registry=r,
        )
        self.db_errors = Counter(
            "spotswarm_db_errors",
            "Database errors raised by any statement (API, heartbeat flusher, reconciler).",
            ["kind"],
            registry=r,
        )
        self.collector = OrchestratorCollector()
        r.register(self.collector)

    def count_launches(self, launchers: Mapping[str, Launcher]) -> dict[str, Launcher]:
        """The same launchers, each wrapped so launches, terminations and failures are counted."""
        return {name: CountedLauncher(name, launcher, self) for name, launcher in launchers.items()}

    def attach(self, ctx: AppContext, services: Sequence[BackgroundService]) -> None:
        """Start reading run values from ``ctx`` at scrape time and count ``ctx.db``'s errors."""
        self.collector.attach(ctx, services)
        event.listen(ctx.db.engine, "handle_error", self._on_db_error)

    def detach(self, db: Database) -> None:
        """Stop reading from the context (the app is shutting down)."""
        self.collector.detach()
        if event.contains(db.engine, "handle_error", self._on_db_error):
            event.remove(db.engine, "handle_error", self._on_db_error)

    def _on_db_error(self, context: ExceptionContext) -> None:
        self.db_errors.labels(_db_error_kind(context)).inc()

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        self.request_seconds.labels(route, method, str(status)).observe(seconds)
        if route == HEARTBEAT_ROUTE and method == "POST":
            result = "accepted" if status < 400 else "rejected" if status < 500 else "error"
            self.heartbeats.labels(result).inc()


def _db_error_kind(context: ExceptionContext) -> str:
    if context.is_disconnect:
        return "disconnect"
    error = context.sqlalchemy_exception
    if isinstance(error, IntegrityError):
        return "integrity"
    if isinstance(error, OperationalError):
        return "operational"
    return "other"


class RequestMetricsMiddleware:
    """Times every HTTP request and records it under its route template (``/api/v1/runs/{name}``)."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client gets when the app raises before answering

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            seconds = time.perf_counter() - started
            self.metrics.observe_request(route_template(scope), scope["method"], status, seconds)


def route_template(scope: Scope) -> str:
    """The full template of the matched route (``/api/v1/runs/{name}``), or ``unmatched``.

    The router records the matched route in the scope with its path relative to the router it was
    included from; the literal prefix is the part of the request path in front of the template's
    segments. A template with a ``{...:path}`` parameter spans any number of segments: it is kept
    relative (still a bounded label).
    """
    template = getattr(scope.get("route"), "path", None)
    if not isinstance(template, str) or not template:
        return UNMATCHED_ROUTE
    if ":path}" in template:
        return template
    segments = [s for s in scope["path"].split("/") if s]
    own = [s for s in template.split("/") if s]
    prefix = segments[: max(0, len(segments) - len(own))]
    return "".join(f"/{s}" for s in prefix) + template


class CountedLauncher:
    """A launcher that counts what the reconcile loop asks of it; everything else is the wrapped one's."""

    def __init__(self, name: str, inner: Launcher, metrics: ServiceMetrics) -> None:
        self.name = name
        self.inner = inner
        self._metrics = metrics

    def launch(self, request: LaunchRequest) -> str:
        try:
            handle = self.inner.launch(request)
        except LauncherConfigError:
            self._metrics.launch_failures.labels(self.name, "rejected").inc()
            raise
        self._metrics.launches.labels(self.name).inc()
        return handle

    def terminate(self, request_id: str) -> None:
        self._metrics.terminations.labels(self.name).inc()
        self.inner.terminate(request_id)

    def describe(self) -> list[Instance]:
        return self.inner.describe()

    def poll_errors(self) -> list[LaunchFailure]:
        failures = self.inner.poll_errors()
        if failures:
            self._metrics.launch_failures.labels(self.name, "reported").inc(len(failures))
        return failures

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.inner, attribute)


class OrchestratorCollector(Collector):
    """Reads current values at scrape time: per-run series, runs by state, the reconcile loop, the DHT.

    A database failure during a scrape is logged and leaves the run series out of that scrape (the
    ``spotswarm_db_errors_total`` counter shows it); the service series are still served.
    """

    def __init__(self) -> None:
        self._ctx: AppContext | None = None
        self._reconcilers: list[Any] = []

    def attach(self, ctx: AppContext, services: Sequence[BackgroundService]) -> None:
        self._ctx = ctx
        self._reconcilers = [s.reconciler for s in services if hasattr(s, "reconciler")]

    def detach(self) -> None:
        self._ctx, self._reconcilers = None, []

    def describe(self) -> Iterable[Any]:
        return []  # values depend on the database: nothing to check at registration time

    def collect(self) -> Iterator[Any]:
        ctx = self._ctx
        if ctx is None:
            return
        yield GaugeMetricFamily(
            "spotswarm_dht_up", "1 when the orchestrator's DHT peer runs.", int(ctx.dht.alive())
        )
        yield from _reconciler_families(self._reconcilers)
        try:
            with ctx.db.read() as session:
                snapshot = _read_runs(session, ctx.clock(), ctx.settings.heartbeat_timeout_s)
        except SQLAlchemyError as exc:
            logger.warning("metrics: could not read runs from the database: %s", exc)
            return
        yield from _run_families(snapshot, ctx)


# -- scrape-time reads -------------------------------------------------------------------------------


class _RunSnapshot:
    """What one scrape read from the database, for every run."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self.runs: list[Run] = []
        self.workers_by_state: dict[tuple[int, str], int] = {}
        self.numbers: dict[int, queries.RunNumbers] = {}
        self.checkpoints: dict[int, tuple[int, int, int, datetime]] = {}  # count, bytes, epoch, created
        self.cost_usd: dict[int, float] = {}


def _read_runs(session: Session, now: datetime, heartbeat_timeout_s: float) -> _RunSnapshot:
    """Five queries, whatever the number of runs."""
    snap = _RunSnapshot(now)
    snap.runs = list(session.scalars(select(Run).order_by(Run.id)))
    ids = [r.id for r in snap.runs]
    if not ids:
        return snap
    by_state = select(Worker.run_id, Worker.state, func.count()).group_by(Worker.run_id, Worker.state)
    snap.workers_by_state = {(rid, st): int(n) for rid, st, n in session.execute(by_state)}
    snap.numbers = queries.run_numbers(session, ids, now - timedelta(seconds=heartbeat_timeout_s))
    kept = select(
        Checkpoint.run_id,
        func.count(),
        func.coalesce(func.sum(Checkpoint.size_bytes), 0),
        func.max(Checkpoint.epoch),
    ).group_by(Checkpoint.run_id)
    newest = {rid: ckpt.created_at for rid, ckpt in queries.latest_checkpoints(session, ids).items()}
    snap.checkpoints = {
        rid: (int(n), int(size), int(epoch), newest[rid])
        for rid, n, size, epoch in session.execute(kept)
        if rid in newest
    }
    snap.cost_usd = _costs(session, now)
    return snap


def _costs(session: Session, now: datetime) -> dict[int, float]:
    """USD per run: price per hour from each worker's launch details times the hours it existed."""
    query = select(
        Worker.run_id, Worker.launch_details, Worker.registered_at, Worker.created_at, Worker.ended_at
    )
    costs: dict[int, float] = {}
    for run_id, details, registered_at, created_at, ended_at in session.execute(query):
        price = next(
            (details[k] for k in PRICE_KEYS if isinstance((details or {}).get(k), (int, float))), None
        )
        if price is None:
            continue
        hours = max(0.0, ((ended_at or now) - (registered_at or created_at)).total_seconds()) / 3600.0
        costs[run_id] = costs.get(run_id, 0.0) + float(price) * hours
    return costs


# -- families ----------------------------------------------------------------------------------------


def _gauge(name: str, doc: str, labels: Sequence[str] = ("run",)) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _run_families(snap: _RunSnapshot, ctx: AppContext) -> Iterator[Any]:
    f = {
        "state": _gauge(
            "spotswarm_run_state", "1 for the run's current state, 0 for the others.", ("run", "state")
        ),
        "desired": _gauge("spotswarm_run_desired_workers", "Workers the run should have."),
        "workers": _gauge(
            "spotswarm_run_workers",
            "Workers of the run by state (launching, running and lost are live).",
            ("run", "state"),
        ),
        "epoch": _gauge("spotswarm_run_swarm_epoch", "Highest swarm epoch a worker reported."),
        "speed": _gauge(
            "spotswarm_run_samples_per_second", "Sum of the throughput of freshly heartbeating workers."
        ),
        "loss": _gauge("spotswarm_run_loss", "Mean of the latest losses of freshly heartbeating workers."),
        "dht_epoch": _gauge(
            "spotswarm_run_dht_epoch", "Swarm epoch read from the DHT (hivemind's progress key)."
        ),
        "dht_peers": _gauge(
            "spotswarm_run_dht_peers", "Peers publishing progress under the run's key in the DHT."
        ),
        "dht_speed": _gauge("spotswarm_run_dht_samples_per_second", "Swarm throughput read from the DHT."),
        "dht_age": _gauge(
            "spotswarm_run_dht_read_age_seconds", "Seconds since the run's DHT progress was read."
        ),
        "ckpts": _gauge("spotswarm_run_checkpoints", "Checkpoints kept for the run."),
        "ckpt_bytes": _gauge("spotswarm_run_checkpoint_bytes", "Bytes of the checkpoints kept for the run."),
        "ckpt_epoch": _gauge("spotswarm_run_checkpoint_latest_epoch", "Epoch of the newest checkpoint."),
        "ckpt_age": _gauge("spotswarm_run_checkpoint_latest_age_seconds", "Age of the newest checkpoint."),
        "cost": _gauge("spotswarm_run_cost_usd", "Cost so far of workers whose launcher knows a price."),
    }
    samples = CounterMetricFamily(
        "spotswarm_run_samples", "Samples trained by all workers of the run.", labels=["run"]
    )
    runs_by_state = _gauge("spotswarm_runs", "Runs by state.", ("state",))
    counts = {s.value: 0 for s in RunState}
    for run in snap.runs:
        counts[run.state] = counts.get(run.state, 0) + 1
        _add_run(f, samples, snap, ctx, run)
    for state, count in counts.items():
        runs_by_state.add_metric([state], count)
    yield runs_by_state
    yield samples
    yield from f.values()


def _add_run(
    f: dict[str, GaugeMetricFamily],
    samples: CounterMetricFamily,
    snap: _RunSnapshot,
    ctx: AppContext,
    run: Run,
) -> None:
    name = run.name
    for run_state in RunState:
        f["state"].add_metric([name, run_state.value], 1.0 if run.state == run_state.value else 0.0)
    f["desired"].add_metric([name], run.desired_workers)
    for state in WorkerState:
        f["workers"].add_metric([name, state.value], snap.workers_by_state.get((run.id, state.value), 0))
    numbers = snap.numbers.get(run.id, queries.RunNumbers())
    f["epoch"].add_metric([name], numbers.swarm_epoch)
    samples.add_metric([name], numbers.samples_total)
    f["speed"].add_metric([name], numbers.samples_per_s)
    if numbers.loss is not None:
        f["loss"].add_metric([name], numbers.loss)
    progress = ctx.swarm.get(run.swarm_id)
    if progress is not None:
        f["dht_epoch"].add_metric([name], progress.epoch)
        f["dht_peers"].add_metric([name], progress.num_peers)
        f["dht_speed"].add_metric([name], progress.samples_per_s)
        f["dht_age"].add_metric([name], max(0.0, (snap.now - progress.read_at).total_seconds()))
    count, size, epoch, created_at = snap.checkpoints.get(run.id, (0, 0, -1, snap.now))
    f["ckpts"].add_metric([name], count)
    f["ckpt_bytes"].add_metric([name], size)
    if count:
        f["ckpt_epoch"].add_metric([name], epoch)
        f["ckpt_age"].add_metric([name], max(0.0, (snap.now - created_at).total_seconds()))
    if run.id in snap.cost_usd:
        f["cost"].add_metric([name], snap.cost_usd[run.id])


def _reconciler_families(reconcilers: Sequence[Any]) -> Iterator[Any]:
    if not reconcilers:
        return
    ticks = CounterMetricFamily("spotswarm_reconcile_ticks", "Reconcile loop ticks.")
    errors = CounterMetricFamily(
        "spotswarm_reconcile_errors", "Reconcile ticks that failed (logged, retried)."
    )
    busy = CounterMetricFamily(
        "spotswarm_reconcile_tick_seconds", "Seconds spent in reconcile ticks; / ticks = mean tick duration."
    )
    last = GaugeMetricFamily("spotswarm_reconcile_last_tick_duration_seconds", "Duration of the latest tick.")
    last_at = GaugeMetricFamily(
        "spotswarm_reconcile_last_tick_timestamp_seconds",
        "Unix time of the latest tick (alert when it stalls).",
    )
    # One loop per app in practice; the counters are summed and the latest tick wins if there are more.
    ticks.add_metric([], sum(r.ticks for r in reconcilers))
    errors.add_metric([], sum(r.errors for r in reconcilers))
    busy.add_metric([], sum(r.busy_s for r in reconcilers))
    ticked = [r for r in reconcilers if r.last_tick is not None and r.last_tick_at is not None]
    if ticked:
        latest = max(ticked, key=lambda r: r.last_tick_at)
        last.add_metric([], latest.last_tick.duration_s)
        last_at.add_metric([], latest.last_tick_at.timestamp())
    yield from (ticks, errors, busy, last, last_at)
