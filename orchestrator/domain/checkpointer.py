"""Which worker of a run saves and uploads its checkpoints: one at a time, elected among the live ones.

One rule, in :func:`elect_checkpointer` (SQL, for one run); the heartbeat writer re-runs it for a run
whose cached checkpointer went silent, retires, ends or falls behind (``heartbeats/writer.py``). Reported
epochs count only up to the swarm's (:func:`counted_epoch`), so a worker claiming to be ahead takes
nobody's role.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Run, Worker
from orchestrator.domain.events import record_event
from worker.wire import RunState, WorkerState


def counted_epoch(reported: int, swarm_epoch: int) -> int:
    """A worker's reported epoch as far as it counts (checkpointer election): up to the swarm's."""
    return min(reported, swarm_epoch)


def elect_checkpointer(session: Session, run: Run, now: datetime, heartbeat_timeout_s: float) -> int | None:
    """Make sure exactly one live worker of ``run`` is its checkpointer, if any can be; return its id.

    The current one keeps the role while it runs with a fresh heartbeat, is not retiring and keeps up
    (its swarm epoch within ``checkpoint_every_epochs`` of the most advanced candidate's: a worker
    still joining, or stuck, would otherwise keep the run from ever checkpointing; reported epochs
    count only up to the swarm's, so claiming to be ahead takes nobody's role); otherwise the
    longest-registered such worker takes over (an event records the hand-over). A stopping run keeps
    the checkpointer it had when the stop began: that worker uploads the final checkpoint.
    """
    if run.state == RunState.stopping:
        return run.checkpointer_worker_id
    fresh_after = now - timedelta(seconds=heartbeat_timeout_s)
    query = (
        select(Worker)
        .where(
            Worker.run_id == run.id,
            Worker.state == WorkerState.running,
            Worker.last_heartbeat_at >= fresh_after,
            Worker.retire_requested_at.is_(None),
        )
        .order_by(Worker.registered_at, Worker.id)
    )
    candidates = list(session.scalars(query).all())
    if candidates:
        epochs = {w.id: counted_epoch(w.swarm_epoch, run.swarm_epoch) for w in candidates}
        lead = max(epochs.values())
        candidates = [w for w in candidates if epochs[w.id] >= lead - run.checkpoint_every_epochs]
    if run.checkpointer_worker_id in {w.id for w in candidates}:
        return run.checkpointer_worker_id
    chosen = candidates[0].id if candidates else None
    if chosen != run.checkpointer_worker_id:
        run.checkpointer_worker_id = chosen
        message = f"worker {chosen} checkpoints the run" if chosen else "no live worker can checkpoint"
        record_event(session, run.id, "run.checkpointer", message, now, chosen)
    return chosen
