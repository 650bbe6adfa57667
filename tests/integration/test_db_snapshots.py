"""A read session sees one state of the database, on PostgreSQL too.

A run's view takes its numbers in two queries (loss and metrics of its fresh workers, then counts,
epochs and samples). PostgreSQL's default isolation (read committed) gives each statement its own
snapshot, so a heartbeat committed between the two showed its samples without its loss: a run whose
only worker had reported loss 0.5 answered ``"loss": null`` beside that report's samples. SQLite's
deferred read transaction keeps one snapshot already; this test writes the heartbeat between the two
statements of a PostgreSQL read and checks that the numbers come from one state.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, update

from orchestrator.db.models import Worker
from orchestrator.db.session import Database
from orchestrator.domain.runs import create_run
from orchestrator.domain.states import WorkerState
from orchestrator.domain.views import RunNumbers, run_numbers
from tests.support.specs import run_spec
from worker.protocol.runs import RunSpec

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(60)]

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def database(postgres_url: str) -> Iterator[Database]:
    db = Database(postgres_url)
    db.upgrade()
    try:
        yield db
    finally:
        db.close()


def _run_with_a_silent_worker(db: Database) -> tuple[int, int]:
    spec = RunSpec(**run_spec("snapshot"))
    with db.begin() as session:
        run, _ = create_run(session, spec, NOW)
        worker = Worker(
            run_id=run.id,
            request_id="snapshot-1",
            launcher="manual",
            state=WorkerState.running,
            peer_maddrs=[],
            launch_details={},
            created_at=NOW,
        )
        session.add(worker)
        session.flush()
        return run.id, worker.id


def test_a_heartbeat_committed_during_a_run_view_is_seen_whole_or_not_at_all(database: Database) -> None:
    run_id, worker_id = _run_with_a_silent_worker(database)
    writer = Database(database.url)  # another connection pool: the heartbeat writer's, in effect
    statements: list[str] = []

    def heartbeat_after_the_first_statement(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)
        if len(statements) == 1:
            with writer.begin() as session:
                session.execute(
                    update(Worker)
                    .where(Worker.id == worker_id)
                    .values(samples=320, loss=0.5, samples_per_s=40.0, swarm_epoch=2, last_heartbeat_at=NOW)
                )

    event.listen(database.engine, "after_cursor_execute", heartbeat_after_the_first_statement)
    try:
        with database.read() as session:
            numbers = run_numbers(session, [run_id], fresh_after=NOW - timedelta(seconds=30))[run_id]
    finally:
        event.remove(database.engine, "after_cursor_execute", heartbeat_after_the_first_statement)
        writer.close()
    assert len(statements) >= 2, statements  # the heartbeat came between two statements of one read
    # the read began before the heartbeat: none of it, rather than its samples without its loss
    assert _reported(numbers) == (0, 0, None, 0.0)
    with database.read() as session:
        after = run_numbers(session, [run_id], fresh_after=NOW - timedelta(seconds=30))[run_id]
    assert _reported(after) == (320, 2, 0.5, 40.0)


def _reported(numbers: RunNumbers) -> tuple[int, int, float | None, float]:
    return numbers.samples_total, numbers.swarm_epoch, numbers.loss, numbers.samples_per_s
