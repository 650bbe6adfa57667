"""What registrations of one run read about its other workers, read once per transaction.

Why: registrations arrive in bursts and are written several to a transaction (``api/registrations.py``).
Each needs the run's live and running counts, the slots its live workers hold, peers and checkpoints;
reading those per registration costs a scan of the run's workers each, so a burst of N joins cost N
scans of up to N rows. Here they are read once per transaction and kept up to date by the
registrations themselves. The run's row lock (:func:`lock_run`, taken before anything is written)
keeps other registrations of the run out meanwhile; the values live in ``session.info`` and end with
the session.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Run, Worker
from orchestrator.domain.states import LIVE_WORKER_STATES
from worker.wire import WorkerState

T = TypeVar("T")


@dataclass
class Roster:
    """A run's live workers as its registrations see them: counts and the slots held (slot -> worker)."""

    live: int
    running: int
    slots: dict[int, int]
    next_free: int = 0  # no slot below this one is free

    def became(self, old: WorkerState | None, new: WorkerState) -> None:
        """Count a worker that went from ``old`` (None: a new row) to ``new``."""
        self.live += (new in LIVE_WORKER_STATES) - (old in LIVE_WORKER_STATES)
        self.running += (new == WorkerState.running) - (old == WorkerState.running)

    def take_slot(self, worker_id: int, own: int | None) -> int:
        """``own`` while no other live worker holds it, else the lowest free slot; now held by
        ``worker_id`` (it gives up ``own`` if it moves)."""
        if own is not None and self.slots.get(own, worker_id) == worker_id:
            self.slots[own] = worker_id
            return own
        while self.next_free in self.slots:
            self.next_free += 1
        self.slots[self.next_free] = worker_id
        return self.next_free


def per_transaction(session: Session, key: tuple[object, ...], read: Callable[[], T]) -> T:
    """``read()`` once per session (the transaction of a batch of registrations), then its value."""
    if key not in session.info:
        session.info[key] = read()
    value: T = session.info[key]
    return value


def lock_run(session: Session, run_id: int) -> None:
    """Lock the run's row for the rest of the transaction, once. Taken before the registration writes
    anything: a worker or event row naming the run takes a key-share lock on it (PostgreSQL), and two
    registrations that each held one while waiting for the other's update lock deadlocked."""

    def lock() -> bool:
        session.execute(select(Run.id).where(Run.id == run_id).with_for_update())
        return True

    per_transaction(session, ("run-locked", run_id), lock)


def roster(session: Session, run_id: int) -> Roster:
    """The run's :class:`Roster`, read at its first use in this transaction (under :func:`lock_run`)."""

    def read() -> Roster:
        lock_run(session, run_id)
        rows = session.execute(
            select(Worker.id, Worker.state, Worker.worker_index).where(
                Worker.run_id == run_id, Worker.state.in_(LIVE_WORKER_STATES)
            )
        ).all()
        slots = {index: worker_id for worker_id, _, index in rows if index is not None}
        running = sum(1 for _, state, _ in rows if state == WorkerState.running)
        return Roster(live=len(rows), running=running, slots=slots)

    return per_transaction(session, ("roster", run_id), read)
