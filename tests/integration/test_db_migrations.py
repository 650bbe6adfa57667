"""Orchestrators that start together on one new database migrate it once, without tripping on each other.

Two orchestrators on one PostgreSQL (the HA set-up) usually start at the same moment, and each runs the
migrations at start-up. Without a lock both create alembic's version table at once, and one of them
fails to start (``duplicate key value violates unique constraint "pg_type_typname_nsp_index"``).
Each upgrader is a process of its own, as each orchestrator is, released at one agreed instant.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.helpers import REPO_ROOT

UPGRADERS = 4
ROUNDS = 2
# Imports take a second or two on a busy machine: the processes start, then upgrade at the same instant.
START_AFTER_S = 6.0
UPGRADER = """
import sys, time
from orchestrator.db.session import Database
database = Database(sys.argv[1])
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
database.upgrade()
"""


def _upgrade_together(url: str) -> list[str]:
    """Upgrade ``url`` from ``UPGRADERS`` processes at one instant; the stderr of those that failed."""
    at = time.time() + START_AFTER_S
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", UPGRADER, url, str(at)],
            cwd=REPO_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for _ in range(UPGRADERS)
    ]
    failures = []
    try:
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
