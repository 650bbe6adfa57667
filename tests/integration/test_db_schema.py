"""The migrations build exactly the tables the models declare (on SQLite and PostgreSQL), revision 0008
fills in ``runs.stop_cause`` of existing rows from their state and reason, and from revision 0009 on no
run or worker id is handed out twice."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Table, delete, insert, select, text

from orchestrator.db.models import Base, Event, Run, Worker
from orchestrator.db.session import Database, upgrade
from orchestrator.domain.states import RunState, StopCause

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """An empty database on each backend (not migrated)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'schema.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    db = Database(url)
    try:
        yield db
    finally:
        db.close()


@pytest.mark.timeout(120)
def test_the_migrated_schema_is_what_the_models_declare(database: Database) -> None:
    """Autogenerate finds nothing to change: the state columns are enums in the models and VARCHAR(16)
    in the database, with the same contents."""
    database.upgrade()
    with database.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []


def _old_run(name: str, state: str, reason: str) -> dict[str, object]:
    """A ``runs`` row as revision 0007 stored it (every column without a default)."""
    return {
        "name": name,
        "swarm_id": f"{name}-0",
        "join_token_hash": name.ljust(64, "0"),
        "module": "m:M",
        "module_args": {},
        "datamodule": "m:D",
        "datamodule_args": {},
        "target_batch_size": 64,
        "batch_size": 8,
        "strategy_options": {},
        "min_workers": 0,
        "max_workers": 2,
        "desired_workers": 1,
        "checkpoint_every_epochs": 5,
        "keep_checkpoints": 3,
        "launcher": "local",
        "launcher_options": {},
        "requirements": [],
        "env": {},
        "secret_env": {},
        "trainer": {},
        "report_metrics": [],
        "state": state,
        "state_reason": reason,
        "consecutive_start_failures": 0,
        "created_at": T0,
        "updated_at": T0,
    }


@pytest.mark.timeout(120)
def test_revision_0008_fills_in_the_stop_cause_from_the_old_reason(database: Database) -> None:
    """Before 0008 a stopping run completed when its reason read "stop condition reached"; the
    migration turns that text into the cause once, and finished runs get the cause their state implies."""
    upgrade(database.engine, "0007")
    old_rows = {
        "at-target": ("stopping", "stop condition reached", StopCause.target_reached),
        "by-hand": ("stopping", "stopped by admin", StopCause.user),
        "done": ("completed", "all workers have left", StopCause.target_reached),
        "halted": ("stopped", "all workers have left", StopCause.user),
        "broken": ("failed", "5 workers in a row failed at start-up", StopCause.failed),
        "waiting": ("pending", "created", None),
        "training": ("running", "worker 1 registered", None),
    }
    table = Run.__table__
    with database.engine.begin() as connection:
        for name, (state, reason, _) in old_rows.items():
            connection.execute(insert(table).values(_old_run(name, state, reason)))
    database.upgrade()
    with database.engine.connect() as connection:
        causes = dict(connection.execute(select(Run.name, Run.stop_cause)).all())
        stored = dict(connection.execute(text("SELECT name, stop_cause FROM runs")).all())
        states = dict(connection.execute(select(Run.name, Run.state)).all())
    assert causes == {name: cause for name, (_, _, cause) in old_rows.items()}
    assert stored == {name: cause.value if cause else None for name, (_, _, cause) in old_rows.items()}
    assert states == {name: RunState(state) for name, (state, _, _) in old_rows.items()}


def _old_worker(run_id: int, request_id: str) -> dict[str, object]:
    """A ``workers`` row as revision 0008 stored it (every column without a default)."""
    return {
        "run_id": run_id,
        "request_id": request_id,
        "launcher": "local",
        "manual": False,
        "state": "running",
        "state_reason": "",
        "hostname": "",
        "peer_maddrs": [],
        "launch_details": {},
        "created_at": T0,
        "local_step": 0,
        "swarm_epoch": 0,
        "samples": 0,
        "samples_per_s": 0.0,
        "num_peers": 0,
        "phase": "training",
        "metrics": {},
    }


def _ids(database: Database, table: Table) -> list[int]:
    with database.engine.connect() as connection:
        return sorted(connection.execute(select(table.c.id)).scalars())


@pytest.mark.timeout(120)
def test_ids_of_deleted_runs_and_workers_are_never_handed_out_again(database: Database) -> None:
    """Revision 0009 keeps every row (no cascade from rebuilding ``runs``), and from then on deleting the
    run and workers with the largest ids does not give those ids to the next ones, on either backend."""
    upgrade(database.engine, "0008")
    runs, workers, events = Run.__table__, Worker.__table__, Event.__table__
    with database.engine.begin() as connection:
        for name in ("kept", "deleted"):
            run_id = connection.execute(
                insert(runs).values(_old_run(name, "stopped", ""))
            ).inserted_primary_key[0]
            for n in range(2):
                connection.execute(insert(workers).values(_old_worker(run_id, f"{name}-{n}")))
            connection.execute(insert(events).values(run_id=run_id, at=T0, kind="run.created", message=name))
    database.upgrade()
    assert _ids(database, runs) == [1, 2] and _ids(database, workers) == [1, 2, 3, 4]
    assert _ids(database, events) == [1, 2]

    with database.engine.begin() as connection:
        connection.execute(delete(runs).where(runs.c.name == "deleted"))  # its workers go by cascade
    assert _ids(database, workers) == [1, 2]
    with database.engine.begin() as connection:
        run_id = connection.execute(
            insert(runs).values(_old_run("next", "running", ""))
        ).inserted_primary_key[0]
        worker_id = connection.execute(
            insert(workers).values(_old_worker(run_id, "next-0"))
        ).inserted_primary_key[0]
    assert (run_id, worker_id) == (3, 5)
