"""Run operations and the only functions that change a run's or a worker's state.

The API and the reconcile loop both change states through :func:`set_run_state` and
:func:`set_worker_state` (``workers.py`` uses them for registration and leaving), which allow only the
transitions of ``states.py``. Every change writes an event (``events.py``). Functions take a session
inside a transaction (``with db.begin() as s``) and ``now`` (from the injected clock); they never commit.
Failures raise the typed errors of ``orchestrator/errors.py``: :class:`IllegalTransition` (409),
:class:`NotFound`, :class:`InvalidRequest`.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from orchestrator import tokens
from orchestrator.db.models import Checkpoint, Run, Worker
from orchestrator.domain import reported, swarm_forming
from orchestrator.domain.events import record_event, without_secrets
from orchestrator.domain.states import (
    ACCEPTING_RUN_STATES,
    ACTIVE_RUN_STATES,
    FINISHED_RUN_STATES,
    LIVE_WORKER_STATES,
    RUN_TRANSITIONS,
    STOPPED_RUN_STATES,
    UNENDED_WORKER_STATES,
    WORKER_TRANSITIONS,
    StopCause,
    settled_state,
)
from orchestrator.errors import Conflict, IllegalTransition, InvalidRequest, NotFound, RunExists
from orchestrator.storage.base import package_key
from worker.protocol.runs import RUN_NAME_PATTERN, RunSpec, RunState, StopCondition
from worker.protocol.trainer import TrainerSection
from worker.protocol.workers import WorkerState

logger = logging.getLogger(__name__)
RUN_NAME_RE = re.compile(RUN_NAME_PATTERN)

# -- look-ups ----------------------------------------------------------------------------------


def get_run(session: Session, name: str, *, for_update: bool = False) -> Run:
    """The run called ``name``; raises :class:`NotFound` (also for a name no run can have)."""
    if not RUN_NAME_RE.match(name):  # e.g. a NUL character, which PostgreSQL would refuse with an error
        raise NotFound(f"run {name!r} not found")
    query = select(Run).where(Run.name == name)
    if for_update:
        query = query.with_for_update()
    run = session.scalar(query)
    if run is None:
        raise NotFound(f"run {name!r} not found")
    return run


def get_worker(session: Session, worker_id: int) -> Worker:
    """The worker with ``worker_id``; raises :class:`NotFound`."""
    worker = session.get(Worker, worker_id)
    if worker is None:
        raise NotFound(f"worker {worker_id} not found")
    return worker


def list_active_runs(session: Session) -> Sequence[Run]:
    """Runs the reconciler must look after: pending, running or stopping."""
    return session.scalars(select(Run).where(Run.state.in_(ACTIVE_RUN_STATES)).order_by(Run.id)).all()


def live_workers(
    session: Session, run_id: int, manual: bool | None = None, silent_before: datetime | None = None
) -> Sequence[Worker]:
    """Workers of the run that are launching or running; only those joined by hand (``manual=True``) or
    launched (``False``) when given, only those silent since before ``silent_before`` when given."""
    query = select(Worker).where(Worker.run_id == run_id, Worker.state.in_(LIVE_WORKER_STATES))
    if manual is not None:
        query = query.where(Worker.manual.is_(manual))
    if silent_before is not None:
        query = query.where(func.coalesce(Worker.last_heartbeat_at, Worker.created_at) < silent_before)
    return session.scalars(query.order_by(Worker.id)).all()


def unended_manual_workers(
    session: Session, run_id: int, silent_before: datetime | None = None
) -> Sequence[Worker]:
    """Workers of the run joined by hand that have not ended (running or lost: their tokens still work);
    only those silent since before ``silent_before`` when given."""
    query = select(Worker).where(
        Worker.run_id == run_id, Worker.manual.is_(True), Worker.state.in_(UNENDED_WORKER_STATES)
    )
    if silent_before is not None:
        query = query.where(func.coalesce(Worker.last_heartbeat_at, Worker.created_at) < silent_before)
    return session.scalars(query.order_by(Worker.id)).all()


def count_live_workers(session: Session, run_id: int) -> int:
    """How many workers of the run are launching or running."""
    query = select(func.count()).select_from(Worker)
    live = Worker.state.in_(LIVE_WORKER_STATES)
    return int(session.scalar(query.where(Worker.run_id == run_id, live)) or 0)


def stop_condition(run: Run) -> StopCondition:
    return StopCondition(target_epochs=run.target_epochs, target_samples=run.target_samples)


def swarm_epoch(run: Run, dht_epoch: int | None = None) -> int:
    """The run's swarm epoch as the orchestrator knows it, for the stop condition and the epochs of
    checkpoint uploads: the highest epoch its DHT reader saw (``run.swarm_epoch``, or ``dht_epoch`` just
    read).

    What workers report about themselves in heartbeats never counts here: a worker token, or a join
    token that makes one, would end a run with one made-up number. (A peer admitted to the swarm can
    still publish a false epoch in the DHT; hivemind's own peers follow it too.)
    """
    return max(run.swarm_epoch, dht_epoch or 0)


def run_spec(run: Run) -> RunSpec:
    """The run's spec as the wire model (with its current worker counts); secret values are None (only
    registrations carry them: :func:`secret_values`). Every spec field is a column of the same name but
    the stop condition (two columns) and the trainer section (JSON)."""
    changed = {
        "stop": stop_condition(run),
        "secret_env": dict.fromkeys(run.secret_env),
        "trainer": TrainerSection.model_validate(run.trainer),
    }
    return RunSpec.model_validate({**run.column_values(RunSpec.model_fields), **changed})


def secret_values(run: Run, worker: Worker) -> dict[str, str]:
    """The run's secret environment variables with their values, for ``worker`` of the run: none for a
    hand-joined worker where the run keeps its secrets from them (``hand_joined_secrets`` false)."""
    if worker.manual and not run.hand_joined_secrets:
        return {}
    return {str(name): str(value) for name, value in run.secret_env.items()}


# -- state changes ----------------------------------------------------------------------------------


def set_run_state(
    session: Session, run: Run, new: RunState, reason: str, now: datetime, cause: StopCause = StopCause.user
) -> bool:
    """Move ``run`` to ``new`` if the table allows it; returns False when it already was there.

    ``reason`` is for people (the run's ``state_reason`` and its event). A run going to ``stopping``
    records ``cause`` as its ``stop_cause`` (:func:`settle_stopping_run` reads it); a failed run's cause
    is ``failed``; a resumed (pending) run has none. Raises :class:`IllegalTransition` for a transition
    the table forbids.
    """
    old = run.state
    if old == new:
        return False
    if new not in RUN_TRANSITIONS[old]:
        raise IllegalTransition(f"run {run.name!r} is {old}; it cannot become {new}")
    reason = without_secrets(run, reason)
    if new in FINISHED_RUN_STATES:
        session.flush()  # the workers' last reports, written in this transaction, count
        note = swarm_forming.ended_note(session, run)
        reason = f"{reason}; {note}" if note else reason
    run.state, run.state_reason, run.updated_at = new, reason, now
    if new == RunState.running and run.started_at is None:
        run.started_at = now
    if new == RunState.stopping:
        run.stop_requested_at, run.stop_cause = now, cause
    if new == RunState.failed:
        run.stop_cause = StopCause.failed
    if new in FINISHED_RUN_STATES:
        run.finished_at = now
        run.checkpointer_worker_id = None
        session.flush()  # the workers' last reports, written in this transaction, count
        run.final_loss, run.final_metrics = reported.final_values(session, run)
    if new == RunState.pending:
        run.finished_at = run.stop_requested_at = run.stop_cause = None
        run.consecutive_start_failures, run.last_start_failure_at = 0, None
    record_event(session, run.id, "run.state", f"{old} -> {new}: {reason}", now)
    return True


def set_worker_state(session: Session, worker: Worker, new: WorkerState, reason: str, now: datetime) -> bool:
    """Move ``worker`` to ``new`` if the table allows it; returns False when it already was there.

    Leaving ``running`` hands the checkpointer role on (at the next election, within a flush interval);
    a worker that ends leaves its last metrics on the run (:func:`reported.keep_metrics`); the last
    live worker of a stopping run leaving ends the run. Raises :class:`IllegalTransition`.
    """
    old = worker.state
    if old == new:
        return False
    if new not in WORKER_TRANSITIONS[old]:
        raise IllegalTransition(f"worker {worker.id} is {old}; it cannot become {new}")
    reason = without_secrets(worker.run, reason)  # a worker's failure message or log tail
    worker.state, worker.state_reason = new, reason
    if new == WorkerState.running:
        worker.ended_at = None
    elif not WORKER_TRANSITIONS[new]:
        worker.ended_at = now
    run = worker.run
    if new != WorkerState.running and run.checkpointer_worker_id == worker.id:
        run.checkpointer_worker_id = None
    record_event(session, run.id, "worker.state", f"{old} -> {new}: {reason}", now, worker.id)
    if new not in LIVE_WORKER_STATES:
        reported.keep_metrics(run, worker.metrics)
        session.flush()
        settle_stopping_run(session, run, now)
    return True


def settle_stopping_run(session: Session, run: Run, now: datetime) -> None:
    """End a stopping run whose workers have all left: ``completed`` if its target was met, else stopped
    (:func:`~orchestrator.domain.states.settled_state`).

    The target counts as met when the run went to ``stopping`` because of it (its ``stop_cause``: the
    reconcile loop saw it on the DHT) or when the swarm epoch the DHT showed meets it (a run stopped by
    hand at its target, or whose last epoch was read as its last worker left: see :func:`swarm_epoch`).
    """
    if run.state != RunState.stopping or live_workers(session, run.id):
        return
    reached = stop_condition(run).reached(swarm_epoch(run), run.target_batch_size)
    set_run_state(session, run, settled_state(run.stop_cause, reached), "all workers have left", now)


# -- run operations (the admin API) -----------------------------------------------------------------


def create_run(session: Session, spec: RunSpec, now: datetime) -> tuple[Run, str]:
    """Insert a pending run; returns it and its join token (shown once). Raises :class:`RunExists`. The
    spec's checks (secrets given, launcher, code) are the use case's (``usecases.UseCases.create_run``),
    which runs them once, before this insert."""
    join_token = tokens.new_token(tokens.JOIN_PREFIX)
    run = Run(
        **spec.model_dump(include=set(Run.column_names() - {"trainer"})),  # the spec's fields, as columns
        swarm_id=f"{spec.name}-{secrets.token_hex(4)}",
        join_token_hash=tokens.hash_token(join_token),
        target_epochs=spec.stop.target_epochs,
        target_samples=spec.stop.target_samples,
        swarm_epoch=0,
        trainer=spec.trainer.model_dump(exclude_defaults=True),
        state=RunState.pending,
        state_reason="created",
        consecutive_start_failures=0,
        created_at=now,
        updated_at=now,
    )
    session.add(run)
    try:
        session.flush()
    except IntegrityError as exc:  # the name is taken (also by a concurrent create that won the race)
        raise RunExists(f"a run named {spec.name!r} exists already") from exc
    record_event(session, run.id, "run.created", f"swarm {run.swarm_id}, {spec.desired_workers} workers", now)
    return run, join_token


def require_secret_values(spec: RunSpec) -> None:
    """Raise :class:`InvalidRequest` for a ``secret_env`` name without a value: a spec read back from the
    API (reads never return secret values) must be given them again."""
    missing = spec.missing_secrets()
    if missing:
        raise InvalidRequest(
            f"secret_env: no value for {', '.join(missing)} (reads never return secret values): give "
            f"them again, e.g. spotswarm runs create ... --secret-env {missing[0]} (from your environment)"
        )


def scale_run(
    session: Session,
    run: Run,
    desired: int,
    now: datetime,
    min_workers: int | None = None,
    max_workers: int | None = None,
) -> None:
    """Change the worker counts of a pending or running run.

    Raises :class:`IllegalTransition` for a stopping or finished run and :class:`InvalidRequest` when
    ``desired`` is outside [min, max] or min > max.
    """
    if run.state not in ACCEPTING_RUN_STATES:
        raise IllegalTransition(f"run {run.name!r} is {run.state}; only pending or running runs scale")
    low = run.min_workers if min_workers is None else min_workers
    high = run.max_workers if max_workers is None else max_workers
    if low > high:
        raise InvalidRequest(f"min_workers ({low}) > max_workers ({high})")
    if not low <= desired <= high:
        raise InvalidRequest(f"desired_workers ({desired}) must lie in [{low}, {high}]")
    old = run.desired_workers
    run.min_workers, run.max_workers, run.desired_workers, run.updated_at = low, high, desired, now
    record_event(session, run.id, "run.scaled", f"desired {old} -> {desired} (min {low}, max {high})", now)


def stop_run(
    session: Session, run: Run, reason: str, now: datetime, cause: StopCause = StopCause.user
) -> None:
    """Ask a run to stop for ``cause``: its workers are told to leave; with none live it ends at once.

    Stopping an already stopping or stopped run is a no-op; a completed or failed one raises
    :class:`IllegalTransition`.
    """
    if run.state in STOPPED_RUN_STATES:
        return
    set_run_state(session, run, RunState.stopping, reason, now, cause)
    settle_stopping_run(session, run, now)


def resume_run(session: Session, run: Run, now: datetime, stop: StopCondition | None = None) -> None:
    """Put a stopped, failed or completed run back to pending, with ``stop`` as its new stop condition
    when given. Its workers start again from its latest checkpoint, so the swarm epoch it counts from
    is that checkpoint's.

    Raises :class:`IllegalTransition` unless the run has finished, and :class:`Conflict` when the run
    would meet its stop condition at once (a completed run resumed without a higher target).
    """
    if run.state not in FINISHED_RUN_STATES:
        raise IllegalTransition(f"run {run.name!r} is {run.state}; only finished runs resume")
    if stop is not None:
        run.target_epochs, run.target_samples = stop.target_epochs, stop.target_samples
    latest = session.scalar(select(func.max(Checkpoint.epoch)).where(Checkpoint.run_id == run.id)) or 0
    run.swarm_epoch = int(latest)
    if stop_condition(run).reached(swarm_epoch(run), run.target_batch_size):
        raise Conflict(
            f"run {run.name!r} reached its stop condition already (its latest checkpoint is of epoch "
            f"{latest}): resume it with a higher target"
        )
    targets = f" (stop at {stop.model_dump(exclude_none=True) or 'nothing'})" if stop is not None else ""
    set_run_state(session, run, RunState.pending, f"resumed{targets}", now)


def rotate_join_token(session: Session, run: Run, now: datetime) -> str:
    """A new join token for ``run`` (returned once); the old one stops working at once. Workers that
    joined keep their worker tokens."""
    join_token = tokens.new_token(tokens.JOIN_PREFIX)
    run.join_token_hash, run.updated_at = tokens.hash_token(join_token), now
    record_event(session, run.id, "run.join_token", "join token rotated: the old one no longer works", now)
    return join_token


def delete_run(session: Session, run: Run) -> list[str]:
    """Delete a finished run and everything it owns; returns the storage keys to remove: its checkpoints,
    and its code package when no other run names it.

    Raises :class:`IllegalTransition` unless the run is stopped, completed or failed.
    """
    if run.state not in FINISHED_RUN_STATES:
        raise IllegalTransition(f"run {run.name!r} is {run.state}; stop it before deleting it")
    keys = list(session.scalars(select(Checkpoint.key).where(Checkpoint.run_id == run.id)))
    if run.workdir is not None:
        shared = select(Run.id).where(Run.workdir == run.workdir, Run.id != run.id).limit(1)
        if session.scalar(shared) is None:
            keys.append(package_key(run.workdir))
    session.delete(run)
    return keys
