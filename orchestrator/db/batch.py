"""Group commit: units of work that arrive together share one transaction.

Why: a registration is a short transaction that locks its run's row; a burst of them (a spot market
handing back capacity, thousands of workers joining) queued one by one on that lock, a commit each, and
on PostgreSQL filled the connection pool. Here one thread (started when work arrives, gone when none
waits) takes every unit of work waiting (up to ``max_batch``), runs them in one transaction, commits,
hands each caller its outcome and takes the next batch. Callers (:meth:`TransactionBatcher.submit`,
awaited) hold no connection meanwhile and no thread either: a burst of registrations costs a thread
hand-off per batch, not one per registration. In a burst (a batch ended a moment ago) the thread
first waits ``gather_s`` for more units: each transaction's reads and commit are paid once for all.

A unit that raises is undone alone and its caller gets the exception; the others go on. Most refusals
come before the unit writes anything, so units run without savepoints (two round trips each); one that
raises after writing has the batch rolled back and run again with each unit in a savepoint (a unit
must therefore be safe to run twice). When the transaction itself fails (the commit, a lost
connection), every caller of the batch gets that exception: nothing of the batch was written.

The rows a unit adds (``session.add``) are written together with the batch's others, in one flush
(one multi-row INSERT per table, not a flush and a round trip per unit); its changes to rows already
there are flushed after it. A unit that needs what the database assigned (ids) does the rest in
``then(session, result)``, called once the batch's rows are written, in the same transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import event
from sqlalchemy.orm import ORMExecuteState, Session

from orchestrator.db.session import Database

T = TypeVar("T")
R = TypeVar("R")

# A batch that starts within this long of the previous one's end is part of a burst (see the module).
BURST_GAP_S = 0.02


@dataclass(eq=False)
class _Job(Generic[T]):
    work: Callable[[Session], Any]
    then: Callable[[Session, Any], T]
    future: asyncio.Future[None]  # its caller awaits it
    result: T | None = None
    error: BaseException | None = None

    def finished(self) -> None:
        """Tell the caller its outcome is there (result or error)."""
        with contextlib.suppress(RuntimeError):  # its event loop closed: nobody waits for it any more
            self.future.get_loop().call_soon_threadsafe(_resolve, self.future)

    def outcome(self) -> T:
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]  # T itself may be None


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():  # a caller that went away (its request cancelled) left it cancelled
        future.set_result(None)


class TransactionBatcher:
    """Runs ``work(session)`` callables in shared transactions of at most ``max_batch`` each."""

    def __init__(self, db: Database, max_batch: int = 64, gather_s: float = 0.005) -> None:
        self._db = db
        self._max_batch = max_batch
        self._gather_s = gather_s
        self._lock = threading.Lock()
        self._waiting: list[_Job[Any]] = []
        self._draining = False  # a thread runs the batches

    @property
    def waiting(self) -> int:
        """How many units of work wait for a transaction (the running batch not counted)."""
        with self._lock:
            return len(self._waiting)

    async def submit(self, work: Callable[[Session], R], then: Callable[[Session, R], T]) -> T:
        """The unit's result once its transaction committed, in two steps: ``work(session)``, and once
        the rows of the whole batch are written (their ids known), ``then(session, <what work
        returned>)``, whose result is returned. Raises what either raised, or what failed the
        transaction. The unit runs even if the awaiting task is cancelled meanwhile."""
        job: _Job[T] = _Job(work, then, asyncio.get_running_loop().create_future())
        self._add(job)
        await job.future
        return job.outcome()

    def _add(self, job: _Job[Any]) -> None:
        with self._lock:
            self._waiting.append(job)
            start, self._draining = not self._draining, True
        if start:
            threading.Thread(target=self._drain, name="transaction-batcher", daemon=True).start()

    def _drain(self) -> None:
        """Run batches while units wait (see the module); then end."""
        last_ended = -1.0
        while True:
            with self._lock:
                if not self._waiting:
                    self._draining = False
                    return
                bursting = len(self._waiting) < self._max_batch
            if bursting and time.monotonic() - last_ended < BURST_GAP_S:
                time.sleep(self._gather_s)
            with self._lock:
                batch, self._waiting = self._waiting[: self._max_batch], self._waiting[self._max_batch :]
            try:
                _run_batch(self._db, batch)
            finally:
                last_ended = time.monotonic()
                for job in batch:
                    job.finished()


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
    nothing to undo. One that fails after writing raises :class:`_UndoNeeded`, as does a failure to
    write the batch's new rows (flushed together once all jobs ran) or in a job's ``then`` step."""
    writes = _Writes()

    def flushed(*_: object) -> None:
        writes.count += 1

    def executed(state: ORMExecuteState) -> None:
        writes.count += not state.is_select

    event.listen(session, "after_flush", flushed)
    event.listen(session, "do_orm_execute", executed)
    for job in batch:
        before, added = writes.count, len(session.new)
        try:
            job.result = job.work(session)
            if session.dirty or session.deleted:  # its changes to rows there now: a failure in them is
                session.flush()  # its own, and the next job starts clean
        except Exception as exc:
            touched = writes.count != before or len(session.new) != added or session.dirty or session.deleted
            if touched or not session.is_active:
                raise _UndoNeeded from exc
            job.error = exc
    _then(session, batch)


def _then(session: Session, batch: list[_Job[Any]]) -> None:
    """Write the batch's new rows (one INSERT per table), then run the ``then`` step of each job that
    got this far; a failure in either is the batch's (:class:`_UndoNeeded`)."""
    try:
        session.flush()
        for job in batch:
            if job.error is None:
                job.result = job.then(session, job.result)
    except Exception as exc:
        raise _UndoNeeded from exc


def _run_in_savepoints(session: Session, batch: list[_Job[Any]]) -> None:
    """Each job in a savepoint: one that fails is undone alone."""
    for job in batch:
        try:
            with session.begin_nested():
                job.result = job.work(session)
                session.flush()
                job.result = job.then(session, job.result)
        except Exception as exc:  # noqa: BLE001 - handed to the job's caller, which raises it
            job.error = exc
