"""Group commit (orchestrator/db/batch.py) on a real SQLite database: units that arrive together share a
transaction, and one that fails, before or after writing, is undone alone."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable

import pytest
from sqlalchemy import event as sqlalchemy_event
from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.batch import TransactionBatcher
from orchestrator.db.models import Event, Run
from orchestrator.db.session import Database
from orchestrator.domain import events, runs
from orchestrator.errors import Conflict
from tests.support.waiting import wait_until
from tests.unit.test_runs_lifecycle import T0, new_run


def _kept(_session: Session, result: str) -> str:
    """A ``then`` step that hands back what the unit's work returned."""
    return result


def _writer(run_id: int, kind: str, fail: str | None = None) -> Callable[[Session], str]:
    """A unit that records an event ``kind``, then raises Conflict if ``fail`` is "after"; with "before"
    it raises before writing."""

    def work(session: Session) -> str:
        if fail == "before":
            raise Conflict(f"{kind}: refused before writing")
        events.record_event(session, run_id, kind, kind, T0)
        session.flush()
        if fail == "after":
            raise Conflict(f"{kind}: refused after writing")
        return kind

    return work


@pytest.mark.timeout(30)
@pytest.mark.parametrize("fail", ["before", "after"])
def test_units_arriving_together_share_a_transaction_and_a_failing_one_is_undone_alone(
    db: Database, fail: str
) -> None:
    name, _ = new_run(db)
    with db.read() as session:
        run_id = runs.get_run(session, name).id
    batcher = TransactionBatcher(db)
    release = threading.Event()
    transactions: list[int] = []  # the transaction (session) each unit ran in, numbered
    numbers = itertools.count()

    def number(session: Session) -> int:
        return int(session.info.setdefault("test-number", next(numbers)))

    def first(session: Session) -> str:  # holds the batch thread until the three others wait together
        transactions.append(number(session))
        release.wait(10)
        return "first"

    def counted(work: Callable[[Session], str]) -> Callable[[Session], str]:
        def unit(session: Session) -> str:
            transactions.append(number(session))
            return work(session)

        return unit

    async def main() -> list[str | BaseException]:
        units = [asyncio.ensure_future(batcher.submit(first, _kept))]
        await asyncio.to_thread(wait_until, lambda: transactions != [], 10, message="the first unit runs")
        for kind, fails in (("ok-1", None), ("bad", fail), ("ok-2", None)):
            units.append(asyncio.ensure_future(batcher.submit(counted(_writer(run_id, kind, fails)), _kept)))
        await asyncio.to_thread(
            wait_until, lambda: batcher.waiting == 3, 10, message="the three others queued"
        )
        release.set()
        async with asyncio.timeout(10):
            return list(await asyncio.gather(*units, return_exceptions=True))

    answers = asyncio.run(main())
    assert answers[0] == "first" and answers[1] == "ok-1" and answers[3] == "ok-2"
    assert isinstance(answers[2], Conflict) and "refused" in str(answers[2])
    assert len(set(transactions[1:])) == 1 + (fail == "after")  # one shared transaction (run again)
    with db.read() as session:
        kinds = set(session.scalars(select(Event.kind).where(Event.run_id == run_id)))
    assert {"ok-1", "ok-2"} <= kinds and "bad" not in kinds


@pytest.mark.timeout(30)
def test_awaited_units_have_their_new_rows_written_together_before_their_then_step(db: Database) -> None:
    """The rows the units add are written in one flush after all of them ran (one multi-row INSERT on
    PostgreSQL; SQLite's driver writes them one by one), and each unit's ``then`` sees its row's id."""
    name, _ = new_run(db)
    with db.read() as session:
        run_id = runs.get_run(session, name).id
    batcher = TransactionBatcher(db)
    release = threading.Event()
    steps: list[str] = []

    def count_inserts(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        if statement.startswith("INSERT INTO events"):
            steps.append("insert")

    def first(session: Session) -> None:  # holds the batch thread until the others wait together
        release.wait(10)

    def add(kind: str) -> Callable[[Session], Event]:
        def work(session: Session) -> Event:
            steps.append("work")
            session.info.setdefault("test-run", session.get(Run, run_id))  # held, as registrations hold it
            return events.record_event(session, run_id, kind, kind, T0)  # added, not written yet

        return work

    def then(session: Session, added: Event) -> tuple[int, int]:
        steps.append("then")
        return added.id, int(session.info.setdefault("test-number", id(session)))

    async def main() -> list[tuple[int, int]]:
        held = asyncio.ensure_future(batcher.submit(first, lambda _s, r: r))
        await asyncio.sleep(0)
        queued = [asyncio.ensure_future(batcher.submit(add(f"row-{i}"), then)) for i in range(3)]
        await asyncio.to_thread(wait_until, lambda: batcher.waiting == 3, 10, message="the three queued")
        sqlalchemy_event.listen(db.engine, "before_cursor_execute", count_inserts)
        release.set()
        await held
        return list(await asyncio.gather(*queued))

    try:
        answers = asyncio.run(main())
    finally:
        sqlalchemy_event.remove(db.engine, "before_cursor_execute", count_inserts)
    ids = [row_id for row_id, _ in answers]
    assert all(isinstance(row_id, int) for row_id in ids) and len(set(ids)) == 3  # known in then
    assert len({transaction for _, transaction in answers}) == 1  # one shared transaction
    assert steps == ["work"] * 3 + ["insert"] * steps.count("insert") + ["then"] * 3 and "insert" in steps
    with db.read() as session:
        kinds = dict(session.execute(select(Event.id, Event.kind).where(Event.id.in_(ids))).all())
    assert [kinds[row_id] for row_id in ids] == ["row-0", "row-1", "row-2"]
