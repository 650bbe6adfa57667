"""The scrape-time half of the orchestrator's metrics: values read from the database, the DHT progress
cache and the reconcile loop when Prometheus scrapes, so they are always current and a deleted run's
series disappear with it. :mod:`orchestrator.metrics.service` registers :class:`OrchestratorCollector`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from orchestrator.context import AppContext
from orchestrator.db.models import Checkpoint, Run, Worker
from orchestrator.domain import averaging, estimates, views
from worker.protocol.runs import RunState
from worker.protocol.workers import AVERAGING_OUTCOMES, WorkerState

if TYPE_CHECKING:
    from orchestrator.reconciler.loop import Reconciler

logger = logging.getLogger(__name__)


class OrchestratorCollector(Collector):
    """Reads current values at scrape time: per-run series, runs by state, the reconcile loop, the DHT.

    A database failure during a scrape is logged and leaves the run series out of that scrape (the
    ``spotswarm_db_errors_total`` counter shows it); the service series are still served.
    """

    def __init__(self) -> None:
        self._ctx: AppContext | None = None
        self._reconcilers: list[Reconciler] = []

    def attach(self, ctx: AppContext, reconcilers: Sequence[Reconciler]) -> None:
        self._ctx = ctx
        self._reconcilers = list(reconcilers)

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
                snapshot = _read_runs(session, ctx.clock(), ctx.settings.reconciler.heartbeat_timeout_s)
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
        self.workers_by_state: dict[tuple[int, WorkerState], int] = {}
        self.numbers: dict[int, views.RunNumbers] = {}
        self.checkpoints: dict[int, tuple[int, int, int, datetime]] = {}  # count, bytes, epoch, created
        self.cost_usd: dict[int, float] = {}
        self.averaging: dict[int, dict[str, Any]] = {}  # outcome counts summed over the run's workers


def _read_runs(session: Session, now: datetime, heartbeat_timeout_s: float) -> _RunSnapshot:
    """Six queries, whatever the number of runs."""
    snap = _RunSnapshot(now)
    snap.runs = list(session.scalars(select(Run).order_by(Run.id)))
    ids = [r.id for r in snap.runs]
    if not ids:
        return snap
    by_state = select(Worker.run_id, Worker.state, func.count()).group_by(Worker.run_id, Worker.state)
    snap.workers_by_state = {(rid, st): int(n) for rid, st, n in session.execute(by_state)}
    snap.numbers = views.run_numbers(session, ids, now - timedelta(seconds=heartbeat_timeout_s))
    kept = select(
        Checkpoint.run_id,
        func.count(),
        func.coalesce(func.sum(Checkpoint.size_bytes), 0),
        func.max(Checkpoint.epoch),
    ).group_by(Checkpoint.run_id)
    newest = {rid: ckpt.created_at for rid, ckpt in views.latest_checkpoints(session, ids).items()}
    snap.checkpoints = {
        rid: (int(n), int(size), int(epoch), newest[rid])
        for rid, n, size, epoch in session.execute(kept)
        if rid in newest
    }
    snap.cost_usd = estimates.run_costs(session, now, ids)
    snap.averaging = averaging.run_totals(session, ids)
    return snap


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
        "loss": _gauge(
            "spotswarm_run_loss",
            "Mean of the latest losses of freshly heartbeating workers; a finished run's last one.",
        ),
        "metric": _gauge(
            "spotswarm_run_metric",
            "A metric the run's workers report (its report_metrics, e.g. val_loss): the mean over freshly "
            "heartbeating workers; a finished run's last value.",
            ("run", "name"),
        ),
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
    f["fraction"] = _gauge(
        "spotswarm_run_averaged_fraction",
        "Worker-epochs on averaged gradients over the recent window (averaging_window_s).",
    )
    f["group"] = _gauge("spotswarm_run_averaging_group_size", "Mean peers per averaged round in the window.")
    f["batch"] = _gauge(
        "spotswarm_run_swarm_batch_ratio",
        "Samples per swarm epoch over target_batch_size in the recent window (1.0: the batch asked for).",
    )
    f["warning"] = _gauge(
        "spotswarm_run_averaging_warning", "1 while the run's averaged fraction is below the threshold."
    )
    f["waiting"] = _gauge(
        "spotswarm_run_averaging_waiting_share",
        "Share of the workers' training time spent waiting on averaging rounds in the recent window.",
    )
    f["g"] = _gauge(
        "spotswarm_run_averaging_g",
        "G: the workers' compute per averaging round over the round's cost in the recent window.",
    )
    outcomes = CounterMetricFamily(
        "spotswarm_run_averaging_epochs",
        "Worker-epochs of the run by averaging outcome (averaged, alone, no_group, timeout, failed, "
        "downloaded), summed over its workers.",
        labels=["run", "outcome"],
    )
    runs_by_state = _gauge("spotswarm_runs", "Runs by state.", ("state",))
    for run in snap.runs:
        _add_run(f, samples, snap, ctx, run)
        for outcome, n in snap.averaging.get(run.id, {}).items():
            if outcome in AVERAGING_OUTCOMES:
                outcomes.add_metric([run.name, outcome], n)
    counts = Counter(run.state for run in snap.runs)
    for state in RunState:
        runs_by_state.add_metric([state.value], counts[state])
    yield runs_by_state
    yield samples
    yield outcomes
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
        f["state"].add_metric([name, run_state.value], 1.0 if run.state == run_state else 0.0)
    f["desired"].add_metric([name], run.desired_workers)
    for state in WorkerState:
        f["workers"].add_metric([name, state.value], snap.workers_by_state.get((run.id, state), 0))
    numbers = snap.numbers.get(run.id, views.RunNumbers())
    reported = views.reported_progress(run, numbers)
    f["epoch"].add_metric([name], numbers.swarm_epoch)
    samples.add_metric([name], numbers.samples_total)
    f["speed"].add_metric([name], numbers.samples_per_s)
    if reported.loss is not None:
        f["loss"].add_metric([name], reported.loss)
    for metric, value in reported.metrics.items():  # bounded: names match report_metrics, 32 at most
        f["metric"].add_metric([name, metric], value)
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
    window = run.averaging or {}
    if window.get("averaged_fraction") is not None:
        f["fraction"].add_metric([name], window["averaged_fraction"])
    if window.get("mean_group_size") is not None:
        f["group"].add_metric([name], window["mean_group_size"])
    if window.get("batch_ratio") is not None:
        f["batch"].add_metric([name], window["batch_ratio"])
    for key, family in (("waiting_share", "waiting"), ("g", "g")):
        if window.get(key) is not None:
            f[family].add_metric([name], window[key])
    if window:
        f["warning"].add_metric([name], 1.0 if window.get("warning") else 0.0)


def _reconciler_families(reconcilers: Sequence[Reconciler]) -> Iterator[Any]:
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
    ticked = [(r.last_tick_at, r.last_tick) for r in reconcilers if r.last_tick and r.last_tick_at]
    if ticked:
        latest_at, latest = max(ticked, key=lambda pair: pair[0])
        last.add_metric([], latest.duration_s)
        last_at.add_metric([], latest_at.timestamp())
    yield from (ticks, errors, busy, last, last_at)
