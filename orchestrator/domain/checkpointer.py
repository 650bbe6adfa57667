"""Which worker of a run saves and uploads its checkpoints: one at a time, elected among the live ones.

One rule, :func:`eligible` (a pure function), says which workers may hold the role. The election
(:func:`elect_checkpointer`, over the database rows of one run) and the heartbeat writer, which decides
from its cache which runs need one (``heartbeats/writer.py``: a checkpointer that went silent, retires,
ended or fell behind), both apply it. Reported epochs count only up to the swarm's (:func:`counted_epoch`),
so a worker claiming to be ahead takes nobody's role. Hand-joined workers hold it only where their run
opts in (``hand_joined_checkpoint``), and then only while no launched worker can: the checkpoint is what
every launched worker resumes from, and a join token may be held by people the admin trusts less.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Run, Worker
from orchestrator.domain.events import record_event
from orchestrator.domain.states import UNENDED_WORKER_STATES, RunState, WorkerState


@dataclass(frozen=True)
class Contender:
    """What the rule reads of a worker (from its row, or from the heartbeat cache)."""

    worker_id: int
    state: WorkerState
    retiring: bool  # asked to leave (scale-down)
    last_seen: datetime | None  # its latest heartbeat
    epoch: int  # the swarm epoch it reported
    manual: bool = False  # joined by hand (the run's join token), not launched


def counted_epoch(reported: int, swarm_epoch: int) -> int:
    """A worker's reported epoch as far as it counts (checkpointer election): up to the swarm's."""
    return min(reported, swarm_epoch)


def eligible(
    contenders: Sequence[Contender],
    swarm_epoch: int,
    every_epochs: int,
    fresh_after: datetime,
    excused: int | None = None,
    hand_joined: bool = False,
) -> list[Contender]:
    """The contenders that may checkpoint the run, in the order given.

    A worker may when it runs with a heartbeat since ``fresh_after``, is not retiring, and keeps up: its
    epoch (counted up to ``swarm_epoch``) is within ``every_epochs`` (the run's
    ``checkpoint_every_epochs``) of the most advanced such worker's. A worker still joining, or stuck,
    would otherwise keep the run from ever checkpointing. ``excused`` is a worker whose silence is not
    held against it (the current checkpointer while the orchestrator has just started: workers could
    not reach it while it was down). Hand-joined workers may only where ``hand_joined`` (the run's
    ``hand_joined_checkpoint``), and then only while no launched worker may.
    """
    live = [
        c
        for c in contenders
        if c.state == WorkerState.running
        and not c.retiring
        and (hand_joined or not c.manual)
        and (c.worker_id == excused or (c.last_seen is not None and c.last_seen >= fresh_after))
    ]
    if not live:
        return []
    lead = max(counted_epoch(c.epoch, swarm_epoch) for c in live)
    keeping_up = [c for c in live if counted_epoch(c.epoch, swarm_epoch) >= lead - every_epochs]
    launched = [c for c in keeping_up if not c.manual]
    return launched or keeping_up


def contender(worker: Worker) -> Contender:
    return Contender(
        worker.id,
        worker.state,
        worker.retire_requested_at is not None,
        worker.last_heartbeat_at,
        worker.swarm_epoch,
        worker.manual,
    )


def elect_checkpointer(session: Session, run: Run, now: datetime, heartbeat_timeout_s: float) -> int | None:
    """Make sure exactly one live worker of ``run`` is its checkpointer, if any can be; return its id.

    The current one keeps the role while it is :func:`eligible` (a hand-joined one loses it to a launched
    worker that is); otherwise the longest-registered eligible worker takes over (an event records the
    hand-over). A stopping run keeps the checkpointer it
    had when the stop began: that worker uploads the final checkpoint.
    """
    if run.state == RunState.stopping:
        return run.checkpointer_worker_id
    query = (
        select(Worker)
        .where(Worker.run_id == run.id, Worker.state.in_(UNENDED_WORKER_STATES))
        .order_by(Worker.registered_at, Worker.id)
    )
    rows = [contender(w) for w in session.scalars(query)]
    fresh_after = now - timedelta(seconds=heartbeat_timeout_s)
    candidates = [
        c.worker_id
        for c in eligible(
            rows,
            run.swarm_epoch,
            run.checkpoint_every_epochs,
            fresh_after,
            hand_joined=run.hand_joined_checkpoint,
        )
    ]
    if run.checkpointer_worker_id in candidates:
        return run.checkpointer_worker_id
    chosen = candidates[0] if candidates else None
    if chosen != run.checkpointer_worker_id:
        run.checkpointer_worker_id = chosen
        message = f"worker {chosen} checkpoints the run" if chosen else "no live worker can checkpoint"
        record_event(session, run.id, "run.checkpointer", message, now, chosen)
    return chosen
