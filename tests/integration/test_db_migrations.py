"""Orchestrators that start together on one new database migrate it once, without tripping on each other.

Two orchestrators on one PostgreSQL (the HA set-up) usually start at the same moment, and each runs the
migrations at start-up. Without a lock both create alembic's version table at once, and one of them
fails to start (``duplicate key value violates unique constraint "pg_type_typname_nsp_index"``).
Each upgrader is a process of its own, as each orchestrator is, released at one agreed instant.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.support.processes import REPO_ROOT

UPGRADERS = 4
ROUNDS = 2
IMPORT_BOUND_S = 60.0  # importing SQLAlchemy and alembic on a busy machine
# Each upgrader imports, says it is ready, then waits for the word to go on its stdin: all are released
# together once every one is ready.
UPGRADER = """
import sys
from orchestrator.db.session import Database
database = Database(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
database.upgrade()
"""


def _first_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline()


def _upgrade_together(url: str) -> list[str]:
    """Upgrade ``url`` from ``UPGRADERS`` processes at one instant; the stderr of those that failed."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", UPGRADER, url],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for _ in range(UPGRADERS)
    ]
    try:
        pool = ThreadPoolExecutor(UPGRADERS)  # readline blocks: one reader each, one deadline
        try:
            said = list(pool.map(_first_line, procs, timeout=IMPORT_BOUND_S))
        finally:
            pool.shutdown(wait=False)  # a reader still blocked ends when its process is killed below
        assert said == ["ready\n"] * UPGRADERS, said
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        failures = []
        for proc in procs:
            _, err = proc.communicate(timeout=90)
            if proc.returncode != 0:
                failures.append(err[-2000:])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    if not failures:
        engine = create_engine(url)
        try:
            with engine.connect() as connection:
                versions = connection.execute(text("SELECT version_num FROM alembic_version")).all()
        finally:
            engine.dispose()
        assert len(versions) == 1, versions
    return failures


@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_orchestrators_starting_together_on_a_new_postgres_database_migrate_it_once(postgres_cluster) -> None:  # type: ignore[no-untyped-def]
    for round_ in range(ROUNDS):
        url = postgres_cluster.create_database(f"migrate_together_{round_}")
        assert _upgrade_together(url) == []


@pytest.mark.timeout(300)
def test_orchestrators_starting_together_on_a_new_sqlite_file_migrate_it_once(tmp_path: Path) -> None:
    for round_ in range(ROUNDS):
        assert _upgrade_together(f"sqlite:///{tmp_path / f'together-{round_}.db'}") == []
