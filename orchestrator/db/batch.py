"""Group commit: units of work that arrive together share one transaction.

Why: a registration is a short transaction that locks its run's row; a burst of them (a spot market
handing back capacity, thousands of workers joining) queued one by one on that lock, a commit each, and
on PostgreSQL filled the connection pool. Here the first caller to arrive becomes the leader: it takes
every unit of work waiting (up to ``max_batch``), runs them in one transaction, commits,
and hands the lead to the next waiting caller, if any. The others wait on their own event and hold no
connection meanwhile.

A unit that raises is undone alone and its caller gets the exception; the others go on. Most refusals
come before the unit writes anything, so units run without savepoints (two round trips each); one that
raises after writing has the batch rolled back and run again with each unit in a savepoint (a unit
must therefore be safe to run twice). When the transaction itself fails (the commit, a lost
connection), every caller of the batch gets that exception: nothing of the batch was written.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from sqlalchemy import event
from sqlalchemy.orm import ORMExecuteState, Session

from orchestrator.db.session import Database

T = TypeVar("T")


@dataclass(eq=False)
class _Job(Generic[T]):
    work: Callable[[Session], T]
    woken: threading.Event = field(default_factory=threading.Event)
    leads: bool = False
    done: bool = False
    result: T | None = None
    error: BaseException | None = None


class TransactionBatcher:
    """Runs ``work(session)`` callables in shared transactions of at most ``max_batch`` each."""

    def __init__(self, db: Database, max_batch: int = 64) -> None:
        self._db = db
        self._max_batch = max_batch
        self._lock = threading.Lock()
        self._waiting: list[_Job[Any]] = []
        self._leading = False

    @property
    def waiting(self) -> int:
        """How many units of work wait for a transaction (the running batch not counted)."""
        with self._lock:
            return len(self._waiting)

    def run(self, work: Callable[[Session], T]) -> T:
        """``work(session)``'s result once its transaction committed; raises what it raised, or what
        failed the transaction. Blocking: call it from a worker thread, not the event loop."""
        job: _Job[T] = _Job(work)
        with self._lock:
            self._waiting.append(job)
            job.leads = not self._leading
            self._leading = True
        while not job.done:
            if job.leads:
                self._lead()
            else:
                job.woken.wait()
                job.woken.clear()
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[return-value]  # T itself may be None

    def _lead(self) -> None:
        """Run the next batch (it holds this caller's job), then wake its callers and the next leader."""
        with self._lock:
            batch, self._waiting = self._waiting[: self._max_batch], self._waiting[self._max_batch :]
        try:
            _run_batch(self._db, batch)
        finally:
            with self._lock:
                following = self._waiting[0] if self._waiting else None
                self._leading = following is not None
                if following is not None:
                    following.leads = True
            for job in batch:
                job.leads = False
                job.done = True
                job.woken.set()
            if following is not None:
                following.woken.set()


def _run_batch(db: Database, batch: list[_Job[Any]]) -> None:
    """The batch in one transaction; the outcome on each job."""
    try:
        try:
            with db.begin() as session:
                _run_plain(session, batch)
        except _UndoNeeded:
            for job in batch:
                job.result, job.error = None, None
            with db.begin() as session:
                _run_in_savepoints(session, batch)
    except BaseException as exc:  # noqa: BLE001 - the whole transaction failed: each caller raises it
        for job in batch:
            job.result, job.error = None, exc


class _UndoNeeded(Exception):
    """A job failed after it had written something: the batch runs again, each job in a savepoint."""


@dataclass
class _Writes:
    count: int = 0


def _run_plain(session: Session, batch: list[_Job[Any]]) -> None:
    """The jobs one after the other without savepoints, which cost two round trips and a flush each:
    a job refused before it wrote anything (an unknown token, a full run: the usual refusals) has
    nothing to undo. One that fails after writing raises :class:`_UndoNeeded`."""
    writes = _Writes()

    def flushed(*_: object) -> None:
        writes.count += 1

    def executed(state: ORMExecuteState) -> None:
        writes.count += not state.is_select

    event.listen(session, "after_flush", flushed)
    event.listen(session, "do_orm_execute", executed)
    for job in batch:
        before = writes.count
        try:
            job.result = job.work(session)
            session.flush()  # its writes now: a failure in them is its own, and the next job starts clean
        except Exception as exc:
            if writes.count != before or session.new or session.dirty or session.deleted:
                raise _UndoNeeded from exc
            job.error = exc


def _run_in_savepoints(session: Session, batch: list[_Job[Any]]) -> None:
    """Each job in a savepoint: one that fails is undone alone."""
    for job in batch:
        try:
            with session.begin_nested():
                job.result = job.work(session)
        except Exception as exc:  # noqa: BLE001 - handed to the job's caller, which raises it
            job.error = exc
