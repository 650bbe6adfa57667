"""Prometheus metrics of the orchestrator, served at ``GET /metrics`` in the Prometheus text format.

Two kinds, in one :class:`prometheus_client.CollectorRegistry` per app (never the global one: a test
process starts many apps):

- **Service counters and histograms**, updated as things happen: request latency by route template and
  status (``middleware.py``), heartbeats accepted/rejected (derived from the heartbeat
  route's status), launches, terminations and launch failures per launcher (:class:`CountedLauncher`
  wraps each launcher), database errors (an engine ``handle_error`` hook).
- **Current values read at scrape time** by :class:`OrchestratorCollector` from the database, the DHT
  progress cache and the reconciler: one set of series per run (workers by state, swarm epoch, samples,
  loss and the metrics its workers report, DHT peers, checkpoints, cost). A deleted run's series
  disappear with it.

Label values are bounded: run names, launcher names, states, route templates, HTTP status codes, the
metric names a run reports (matching its ``report_metrics``, 32 at most). Never a worker id, a request
path or a message. The metric names are listed in docs/operations/metrics.md.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from sqlalchemy import event
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import IntegrityError, OperationalError

from orchestrator.context import AppContext
from orchestrator.db.session import Database
from orchestrator.launchers.base import Instance, Launcher, LauncherConfigError, LaunchFailure, LaunchRequest
from orchestrator.metrics.collector import OrchestratorCollector
from worker.protocol.paths import HEARTBEAT_ROUTE

if TYPE_CHECKING:
    from orchestrator.reconciler.loop import Reconciler

logger = logging.getLogger(__name__)

HEARTBEAT_RESULTS = ("accepted", "rejected", "error")
DB_ERROR_KINDS = ("disconnect", "integrity", "operational", "other")
LAUNCH_FAILURE_KINDS = ("rejected", "reported")
REMEMBERED_TERMINATIONS = 10_000
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
            "Workers the reconcile loop asked a launcher to stop (each counted once).",
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
        # Known label values start at 0, so rate() and alerts see the first event too.
        for result in HEARTBEAT_RESULTS:
            self.heartbeats.labels(result)
        for kind in DB_ERROR_KINDS:
            self.db_errors.labels(kind)
        self.collector = OrchestratorCollector()
        r.register(self.collector)

    def count_launches(self, launchers: Mapping[str, Launcher]) -> dict[str, Launcher]:
        """The same launchers, each wrapped so launches, terminations and failures are counted."""
        for name in launchers:
            self.launches.labels(name)
            self.terminations.labels(name)
            for kind in LAUNCH_FAILURE_KINDS:
                self.launch_failures.labels(name, kind)
        return {name: CountedLauncher(name, launcher, self) for name, launcher in launchers.items()}

    def attach(self, ctx: AppContext, reconcilers: Sequence[Reconciler]) -> None:
        """Start reading run values from ``ctx`` at scrape time and count ``ctx.db``'s errors."""
        self.collector.attach(ctx, reconcilers)
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


class CountedLauncher:
    """A launcher that counts what the reconcile loop asks of it; everything else is the wrapped one's."""

    def __init__(self, name: str, inner: Launcher, metrics: ServiceMetrics) -> None:
        self.name = name
        self.inner = inner
        self._metrics = metrics
        # The loop repeats terminate() until a worker is gone: count each request id once (bounded memory).
        self._terminated: OrderedDict[str, None] = OrderedDict()

    def validate_options(self, options: Mapping[str, Any], *, workers: int = 1) -> None:
        self.inner.validate_options(options, workers=workers)

    def peers_per_machine(self, options: Mapping[str, Any]) -> int:
        return self.inner.peers_per_machine(options)

    def launch(self, request: LaunchRequest) -> str:
        try:
            handle = self.inner.launch(request)
        except LauncherConfigError:
            self._metrics.launch_failures.labels(self.name, "rejected").inc()
            raise
        self._metrics.launches.labels(self.name).inc()
        return handle

    def terminate(self, request_id: str) -> None:
        if request_id not in self._terminated:
            self._terminated[request_id] = None
            if len(self._terminated) > REMEMBERED_TERMINATIONS:
                self._terminated.popitem(last=False)
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
