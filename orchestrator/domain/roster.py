"""What registrations of one run read about its other workers, read once per transaction.

Why: registrations arrive in bursts and are written several to a transaction (``db/batch.py``).
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

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from orchestrator.db.models import Run, Worker
from orchestrator.domain.states import LIVE_WORKER_STATES
from worker.protocol.workers import WorkerState

T = TypeVar("T")


@dataclass
class Roster:
    """A run's live workers as its registrations see them: how many, how many run, and the slots held.

    The slots held are read only when needed: while they are dense (0..n-1, the usual case in a burst
    of joins) the next free slot is n, known from two aggregates; a gap (a worker left) makes the first
    registration that needs a slot read them all, once per transaction.
    """

    live: int
    running: int
    held: int  # live workers with a slot
    top: int  # their highest slot (-1: none)
    read_slots: Callable[[], dict[int, int]]  # slot -> worker id, from the database
    _slots: dict[int, int] | None = None
    _next_free: int = 0  # no slot below this one is free

    def became(self, old: WorkerState | None, new: WorkerState) -> None:
        """Count a worker that went from ``old`` (None: a new row) to ``new``."""
        self.live += (new in LIVE_WORKER_STATES) - (old in LIVE_WORKER_STATES)
        self.running += (new == WorkerState.running) - (old == WorkerState.running)

    def take_slot(self, worker_id: int, own: int | None) -> int:
        """``own`` while no other live worker holds it, else the lowest free slot; now held by
        ``worker_id``."""
        if own is None and self._slots is None and self.held == self.top + 1:
            self.held, self.top = self.held + 1, self.top + 1  # dense: the next slot is free
            return self.top
        if self._slots is None:
            self._slots = self.read_slots()
        slots = self._slots
        if own is not None and slots.get(own, worker_id) == worker_id:
            slots[own] = worker_id
            return own
        while self._next_free in slots:
            self._next_free += 1
        slots[self._next_free] = worker_id
        return self._next_free


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

    per_transaction(session, _locked(run_id), lock)


def _locked(run_id: int) -> tuple[str, int]:
    """The key that marks the run's row locked in this transaction (``session.info``)."""
    return ("run-locked", run_id)


def lock_run_of_join_token(session: Session, digest: str) -> Run | None:
    """The run whose join token has this digest (None: no such run), locked as :func:`lock_run` does,
    in the same query."""
    run = session.scalar(select(Run).where(Run.join_token_hash == digest).with_for_update())
    if run is not None:
        session.info[_locked(run.id)] = True
    return run


def roster(session: Session, run_id: int) -> Roster:
    """The run's :class:`Roster`, read at its first use in this transaction (under :func:`lock_run`)."""
    return per_transaction(session, ("roster", run_id), lambda: _read_roster(session, run_id))


def _read_roster(session: Session, run_id: int) -> Roster:
    lock_run(session, run_id)
    live = Worker.run_id == run_id, Worker.state.in_(LIVE_WORKER_STATES)

    def read_slots() -> dict[int, int]:
        query = select(Worker.worker_index, Worker.id).where(*live, Worker.worker_index.is_not(None))
        return {index: worker_id for index, worker_id in session.execute(query) if index is not None}

    running = func.count(case((Worker.state == WorkerState.running, 1)))
    query = select(func.count(), running, func.count(Worker.worker_index), func.max(Worker.worker_index))
    counts = session.execute(query.where(*live)).one()
    top = -1 if counts[3] is None else int(counts[3])
    return Roster(int(counts[0]), int(counts[1]), int(counts[2]), top, read_slots)
