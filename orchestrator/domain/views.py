"""The read side of the API: runs with their live numbers, events, progress series, workers, peers.

Everything here only reads. Live numbers come from worker rows (written by the heartbeat flusher about
once a second) and from the swarm progress cache (the DHT reader); nothing here blocks on the DHT.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from pydantic import BaseModel
from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from orchestrator.db.models import Base, Checkpoint, Event, ProgressSample, Run, Worker
from orchestrator.domain import averaging, checkpoints, churn, estimates, reported, runs, sync
from orchestrator.domain.states import FINISHED_RUN_STATES
from orchestrator.launchers.base import PUBLIC_DETAILS
from orchestrator.progress import SwarmProgressCache
from orchestrator.schemas import (
    ChurnMark,
    EventOut,
    EventPage,
    Goodput,
    ProgressPoint,
    ProgressSeries,
    ReportedProgress,
    RunAveraging,
    RunOut,
    SwarmProgress,
    WorkerCounts,
    WorkerOut,
)
from worker.protocol.runs import RunSpec, RunState
from worker.protocol.workers import AveragingCounts, WorkerState

T = TypeVar("T")
MAX_WORKER_PEERS = 16
MAX_PEER_WORKERS = 8


@dataclass(frozen=True)
class RunNumbers:
    """A run's worker counts and what its workers reported (see :func:`run_numbers`)."""

    launching: int = 0
    running: int = 0
    fresh: int = 0  # running with a fresh heartbeat
    swarm_epoch: int = 0
    samples_total: int = 0
    loss: float | None = None
    samples_per_s: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)


def run_numbers(session: Session, run_ids: Sequence[int], fresh_after: datetime) -> dict[int, RunNumbers]:
    """Worker counts and reported progress of several runs in two queries: highest epoch and samples over
    all their workers; throughput, loss and metrics over the :func:`~orchestrator.domain.reported.fresh`
    ones. The one per-run aggregate: run views, progress samples (the heartbeat writer) and ``/metrics``
    all read it."""
    if not run_ids:
        return {}
    running = Worker.state == WorkerState.running
    fresh = reported.fresh(fresh_after)
    query = (
        select(
            Worker.run_id,
            func.sum(case((Worker.state == WorkerState.launching, 1), else_=0)),
            func.sum(case((running, 1), else_=0)),
            func.sum(case((fresh, 1), else_=0)),
            func.max(Worker.swarm_epoch),
            func.sum(Worker.samples),
            func.sum(case((fresh, Worker.samples_per_s), else_=0.0)),
        )
        .where(Worker.run_id.in_(run_ids))
        .group_by(Worker.run_id)
    )
    values = reported.fresh_values(session, run_ids, fresh_after)
    numbers = {}
    for run_id, launching, n_running, n_fresh, epoch, samples, speed in session.execute(query):
        loss, metrics = values.get(run_id, (None, {}))
        numbers[run_id] = RunNumbers(
            int(launching or 0),
            int(n_running or 0),
            int(n_fresh or 0),
            int(epoch or 0),
            int(samples or 0),
            loss,
            float(speed or 0.0),
            metrics,
        )
    return numbers


def latest_checkpoints(session: Session, run_ids: Sequence[int]) -> dict[int, Checkpoint]:
    """The newest checkpoint of each run that has one."""
    if not run_ids:
        return {}
    newest = (
        select(Checkpoint.run_id, func.max(Checkpoint.epoch).label("epoch"))
        .where(Checkpoint.run_id.in_(run_ids))
        .group_by(Checkpoint.run_id)
        .subquery()
    )
    query = select(Checkpoint).join(
        newest, (Checkpoint.run_id == newest.c.run_id) & (Checkpoint.epoch == newest.c.epoch)
    )
    return {c.run_id: c for c in session.scalars(query)}


# The spec fields whose values are the user's own (free-form JSON): left out of the public view.
FREE_FORM_SPEC_FIELDS = (
    "module_args",
    "datamodule_args",
    "strategy_options",
    "launcher_options",
    "env",
    "secret_env",
    "requirements",
)


def public_spec(spec: RunSpec) -> RunSpec:
    """``spec`` without the values of its free-form fields (they may name buckets, hosts, private package
    indexes or keys), the arguments of its trainer callbacks and loggers included."""
    trainer = spec.trainer.model_copy(
        update={
            kind: [plugin.model_copy(update={"args": {}}) for plugin in getattr(spec.trainer, kind)]
            for kind in ("callbacks", "loggers")
        }
    )
    emptied = {field: type(getattr(spec, field))() for field in FREE_FORM_SPEC_FIELDS}
    return spec.model_copy(update={**emptied, "trainer": trainer})


def runs_out(
    session: Session,
    rows: Sequence[Run],
    swarm: SwarmProgressCache,
    now: datetime,
    heartbeat_timeout_s: float,
    full: bool = True,
) -> list[RunOut]:
    """API views of ``rows`` with their live numbers, cost and ETA (four queries for the whole page);
    the public view unless ``full``."""
    ids = [r.id for r in rows]
    numbers = run_numbers(session, ids, now - timedelta(seconds=heartbeat_timeout_s))
    latest = latest_checkpoints(session, ids)
    costs = estimates.run_costs(session, now, ids)
    return [
        _run_out(r, numbers.get(r.id, RunNumbers()), latest.get(r.id), costs.get(r.id), swarm, full)
        for r in rows
    ]


def _run_out(
    run: Run,
    numbers: RunNumbers,
    latest: Checkpoint | None,
    cost_usd: float | None,
    swarm: SwarmProgressCache,
    full: bool,
) -> RunOut:
    progress = swarm.get(run.swarm_id)
    spec = runs.run_spec(run)
    eta_s = estimates.eta_s(
        run.state,
        spec.stop,
        run.target_batch_size,
        samples_total=numbers.samples_total,
        samples_per_s=numbers.samples_per_s,
        swarm_epoch=max(numbers.swarm_epoch, progress.epoch if progress else 0),
        samples_in_epoch=progress.samples_accumulated if progress else 0,
    )
    fields = same_fields(
        run,
        RunOut,
        spec=spec if full else public_spec(spec),
        sync=sync.sync_of(spec.strategy_options),
        workers=WorkerCounts(
            desired=run.desired_workers,
            min=run.min_workers,
            max=run.max_workers,
            live=numbers.launching + numbers.running,
            running=numbers.running,
            launching=numbers.launching,
        ),
        reported=reported_progress(run, numbers),
        swarm=SwarmProgress.model_validate(progress, from_attributes=True) if progress else None,
        checkpointer_worker_id=str(run.checkpointer_worker_id) if run.checkpointer_worker_id else None,
        latest_checkpoint=checkpoints.to_ref(run, latest) if latest else None,
        averaging=RunAveraging.model_validate(run.averaging) if run.averaging else None,
        cost_usd=cost_usd,
        eta_s=eta_s,
        redacted=not full,
    )
    return RunOut(**fields)


def reported_progress(run: Run, numbers: RunNumbers) -> ReportedProgress:
    """What the run's workers reported: live numbers, and for a finished run its last loss and metrics;
    a metric no live worker reports keeps its last value (:func:`reported.with_kept`)."""
    finished = run.state in FINISHED_RUN_STATES
    return ReportedProgress(
        swarm_epoch=numbers.swarm_epoch,
        samples_total=numbers.samples_total,
        loss=run.final_loss if finished else numbers.loss,
        samples_per_s=numbers.samples_per_s,
        metrics=dict(run.final_metrics or {}) if finished else reported.with_kept(run, numbers.metrics),
    )


def list_runs(session: Session, state: RunState | None, limit: int, offset: int) -> tuple[Sequence[Run], int]:
    """A page of runs, newest first, and the total matching ``state``."""
    query = select(Run)
    count = select(func.count()).select_from(Run)
    if state is not None:
        query, count = query.where(Run.state == state), count.where(Run.state == state)
    rows = session.scalars(query.order_by(Run.id.desc()).limit(limit).offset(offset)).all()
    return rows, int(session.scalar(count) or 0)


def events_page(session: Session, run_id: int, after_id: int, limit: int) -> EventPage:
    """Events with id > ``after_id``, oldest first; ``next_after_id`` continues from the last one."""
    query = select(Event).where(Event.run_id == run_id, Event.id > after_id).order_by(Event.id).limit(limit)
    items = [
        EventOut(
            id=e.id,
            at=e.at,
            kind=e.kind,
            message=e.message,
            worker_id=str(e.worker_id) if e.worker_id is not None else None,
        )
        for e in session.scalars(query)
    ]
    return EventPage(items=items, next_after_id=items[-1].id if items else after_id)


def same_fields(row: Base, model: type[BaseModel], **changed: Any) -> dict[str, Any]:
    """The row's columns that ``model`` has a field of the same name for, as stored, with ``changed``
    (values the view converts: ids as strings, copies of JSON, the public launch details) instead."""
    return {**row.column_values(model.model_fields), **changed}


def downsample(items: Sequence[T], max_points: int) -> list[T]:
    """At most ``max_points`` items spread evenly over ``items``, always keeping the first and last."""
    count = len(items)
    if count <= max_points:
        return list(items)
    if max_points == 1:
        return [items[-1]]
    picks = sorted({round(i * (count - 1) / (max_points - 1)) for i in range(max_points)})
    return [items[i] for i in picks]


def progress_series(session: Session, run: Run, max_points: int) -> ProgressSeries:
    """The run's stored progress samples, oldest first, downsampled to ``max_points``, with the desired
    worker count at each, its notice and loss marks and its goodput over the last hour (``churn.py``:
    goodput reads every stored sample, not the downsampled ones)."""
    query = (
        select(ProgressSample)
        .where(ProgressSample.run_id == run.id)
        .order_by(ProgressSample.at, ProgressSample.id)
    )
    rows = session.scalars(query).all()
    shown = downsample(rows, max_points)
    desired = churn.desired_at(
        [p.at for p in shown], churn.scaled_events(session, run.id), run.desired_workers
    )
    points = [
        ProgressPoint(**same_fields(p, ProgressPoint, metrics=dict(p.metrics or {}), desired_workers=d))
        for p, d in zip(shown, desired, strict=True)
    ]
    diloco = sync.sync_of(run.strategy_options) == "diloco"
    samples = [
        churn.Sample(
            p.at,
            max(p.swarm_epoch, p.dht_epoch or 0),
            p.live_workers,
            int((p.averaging or {}).get("kept_samples", 0)) if diloco else None,
        )
        for p in rows
    ]
    measured = churn.goodput(samples, run.target_batch_size)
    marks = [
        ChurnMark(
            at=m.at, kind=m.kind, worker_id=None if m.worker_id is None else str(m.worker_id), reason=m.reason
        )
        for m in churn.marks(session, run.id)
    ]
    return ProgressSeries(
        points=points,
        stored_points=len(rows),
        marks=marks,
        goodput=Goodput.model_validate(measured, from_attributes=True) if measured else None,
    )


def worker_out(worker: Worker, run: Run, now: datetime, full: bool = True) -> WorkerOut:
    """The API view of a worker (its cost up to ``now``); the public view (launch details that locate
    nothing) unless ``full``."""
    details = dict(worker.launch_details)
    if not full:
        details = {key: value for key, value in details.items() if key in PUBLIC_DETAILS}
    fields = same_fields(
        worker,
        WorkerOut,
        id=str(worker.id),
        run=run.name,
        peer_maddrs=list(worker.peer_maddrs),
        launch_details=details,
        metrics=dict(worker.metrics or {}),
        averaging=AveragingCounts.model_validate(worker.averaging) if worker.averaging else None,
        averaged_fraction=averaging.worker_fraction(worker.averaging),
        checkpointer=run.checkpointer_worker_id == worker.id,
        cost_usd=estimates.worker_cost_usd(
            worker.launch_details, worker.registered_at, worker.created_at, worker.ended_at, now
        ),
        redacted=not full,
    )
    return WorkerOut(**fields)


def list_workers(
    session: Session,
    run: Run,
    state: WorkerState | None,
    limit: int,
    offset: int,
    now: datetime,
    full: bool = True,
) -> tuple[list[WorkerOut], int]:
    """A page of the run's workers, newest first, and the total matching ``state`` (public view unless
    ``full``)."""
    query = select(Worker).where(Worker.run_id == run.id)
    count = select(func.count()).select_from(Worker).where(Worker.run_id == run.id)
    if state is not None:
        query, count = query.where(Worker.state == state), count.where(Worker.state == state)
    rows = session.scalars(query.order_by(Worker.id.desc()).limit(limit).offset(offset)).all()
    return [worker_out(w, run, now, full) for w in rows], int(session.scalar(count) or 0)


def worker_peers(session: Session, run_id: int) -> list[str]:
    """Multiaddrs reported by the run's running workers, freshest heartbeat first, at most 16."""
    query = (
        select(Worker.peer_maddrs)
        .where(Worker.run_id == run_id, Worker.state == WorkerState.running)
        .order_by(Worker.last_heartbeat_at.desc().nulls_last())
        .limit(MAX_PEER_WORKERS)
    )
    seen: dict[str, None] = {}
    for maddrs in session.scalars(query):
        for maddr in maddrs or []:
            seen.setdefault(str(maddr), None)
    return list(seen)[:MAX_WORKER_PEERS]
