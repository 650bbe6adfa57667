"""A run's loss and metrics, aggregated from what its workers reported in their latest heartbeats.

Each metric of a run (``val_loss``, ``lr-Optimizer``, ...) is the mean over the workers that count and
report it; so is the loss. Which workers count:

- while the run is active, those running with a fresh heartbeat (:func:`fresh_values`);
- once it has finished, those whose last heartbeat came after the stop was asked for, that is their
  final reports as they left (:func:`final_values`, stored on the run when it finishes, so a finished
  run keeps its last loss and metrics). When none did (every worker had gone before), the run keeps the
  values of its latest progress sample that has any.

A metric that none of those workers reports keeps its last value: each worker that leaves (or is lost)
leaves its last metrics on the run (:func:`keep_metrics`, in ``Run.final_metrics``; a deregistration can
carry values newer than the worker's last heartbeat), and they fill in what the counted workers lack
(:func:`with_kept`), while the run is active and when it finishes. So the ``val_loss`` of a run stopped,
resumed and stopped again before its new workers validated is the old one, not gone.

Every worker validates on its own and keeps reporting its latest validation result until it validates
again, so a run's ``val_*`` value is the mean of the latest validation of each worker that counts: they
validate the same parameters (averaged every swarm epoch) on the same data, and differ by what each
trained locally since the last average.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, select
from sqlalchemy.orm import Session

from orchestrator.db.models import ProgressSample, Run, Worker
from worker.protocol.metrics import MAX_REPORTED_METRICS
from worker.protocol.workers import WorkerState

Values = tuple[float | None, dict[str, float]]  # (loss, metrics by name)
FALLBACK_SAMPLES = 100  # progress samples looked through for the latest values of a run that has no others


def mean_values(reports: Iterable[tuple[float | None, Mapping[str, Any] | None]]) -> Values:
    """The mean loss and the mean of each metric over ``reports`` (each a loss and metrics); a name
    counts the reports that have it. At most :data:`MAX_REPORTED_METRICS` names, first by name."""
    losses: list[float] = []
    sums: dict[str, tuple[float, int]] = {}
    for loss, metrics in reports:
        if loss is not None:
            losses.append(float(loss))
        for name, value in (metrics or {}).items():
            if isinstance(value, (int, float)):
                total, count = sums.get(name, (0.0, 0))
                sums[name] = (total + float(value), count + 1)
    names = sorted(sums)[:MAX_REPORTED_METRICS]
    mean_loss = sum(losses) / len(losses) if losses else None
    return mean_loss, {name: sums[name][0] / sums[name][1] for name in names}


def fresh(fresh_after: datetime) -> ColumnElement[bool]:
    """The workers whose reports count while a run is active: running, heard from since ``fresh_after``
    (their loss, metrics and throughput; ``views.run_numbers`` counts them too)."""
    return and_(Worker.state == WorkerState.running, Worker.last_heartbeat_at >= fresh_after)


def fresh_values(session: Session, run_ids: Sequence[int], fresh_after: datetime) -> dict[int, Values]:
    """Loss and metrics of each run over its :func:`fresh` workers."""
    if not run_ids:
        return {}
    query = select(Worker.run_id, Worker.loss, Worker.metrics).where(
        Worker.run_id.in_(list(run_ids)), fresh(fresh_after)
    )
    reports: dict[int, list[tuple[float | None, Mapping[str, Any] | None]]] = {}
    for run_id, loss, metrics in session.execute(query):
        reports.setdefault(run_id, []).append((loss, metrics))
    return {run_id: mean_values(rows) for run_id, rows in reports.items()}


def with_kept(run: Run, metrics: Mapping[str, float]) -> dict[str, float]:
    """``metrics``, and for each name they lack the value the run kept (:func:`keep_metrics`): a metric
    that no worker counted reports now (the resumed workers have not validated yet; the worker that
    validated has left) shows its last value instead of vanishing. At most :data:`MAX_REPORTED_METRICS`,
    first by name."""
    merged = {**(run.final_metrics or {}), **metrics}
    return {name: merged[name] for name in sorted(merged)[:MAX_REPORTED_METRICS]}


def keep_metrics(run: Run, metrics: Mapping[str, Any] | None) -> None:
    """Keep a leaving worker's last ``metrics`` on its run (``Run.final_metrics``), over what was kept."""
    values = {k: float(v) for k, v in (metrics or {}).items() if isinstance(v, (int, float))}
    if values:
        run.final_metrics = with_kept(run, values)


def final_values(session: Session, run: Run) -> Values:
    """What a run that is finishing keeps: see the module docstring."""
    loss, metrics = _last_values(session, run)
    return loss, with_kept(run, metrics)


def _last_values(session: Session, run: Run) -> Values:
    """The mean of the final reports, or the latest progress sample's values when there are none."""
    if run.stop_requested_at is not None:
        query = select(Worker.loss, Worker.metrics).where(
            Worker.run_id == run.id, Worker.last_heartbeat_at >= run.stop_requested_at
        )
        loss, metrics = mean_values((row.loss, row.metrics) for row in session.execute(query))
        if loss is not None or metrics:
            return loss, metrics
    latest = session.execute(
        select(ProgressSample.loss, ProgressSample.metrics)
        .where(ProgressSample.run_id == run.id)
        .order_by(ProgressSample.at.desc(), ProgressSample.id.desc())
        .limit(FALLBACK_SAMPLES)
    )
    for loss, metrics in latest:
        if loss is not None or metrics:
            return loss, dict(metrics or {})
    return None, {}
