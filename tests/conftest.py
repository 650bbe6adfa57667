"""Shared fixtures: processes that are always killed, a throwaway PostgreSQL, the orchestrators tests
start (one factory, and ``served_orch``: one `spotswarm serve` subprocess per module, with the settings
the module names), and no silent skips."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from orchestrator.db.session import Database
from tests.support.orchestrator import HAND_ONLY, Orchestrator, OrchestratorFactory, start_orchestrator
from tests.support.postgres import PostgresCluster, running_postgres, session_postgres
from tests.support.processes import ProcessRegistry

# Plugins of tests/support modules, for every test: the moto server standing in for AWS; the lanes of a
# run in several processes, and the PostgreSQL cluster they share.
pytest_plugins = ["tests.support.aws", "tests.support.lanes", "tests.support.postgres"]

_db_counter = itertools.count()


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    """A fresh SQLite database, migrated to the latest schema, for one test."""
    database = Database(f"sqlite:///{tmp_path / 'test.db'}")
    database.upgrade()
    try:
        yield database
    finally:
        database.close()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[ProcessRegistry]:
    """Start subprocesses through this; each is killed (by process group) when the test ends."""
    registry = ProcessRegistry(tmp_path)
    try:
        yield registry
    finally:
        registry.kill_all()


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """One PostgreSQL 15 server for the whole test run (``tests/support/postgres.py``: started by this
    process on first use, or by the controller of a run of several processes)."""
    with session_postgres() as cluster:
        yield cluster


@pytest.fixture
def own_postgres_cluster() -> Iterator[PostgresCluster]:
    """A PostgreSQL server of this test's own, for a test that stops and starts it under what uses it
    (stopping the shared one would cut other tests off); stopped when the test ends."""
    with running_postgres() as cluster:
        yield cluster


@pytest.fixture
def postgres_url(postgres_cluster: PostgresCluster) -> str:
    """A fresh, empty database on the throwaway cluster for one test."""
    return postgres_cluster.create_database(f"t{next(_db_counter)}")


@pytest.fixture(scope="module")
def orchestrator_factory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OrchestratorFactory]:
    """Start orchestrators for the tests of one module; every one is killed when the module ends."""
    root = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])
    registry = ProcessRegistry(root)
    started = itertools.count()

    def start(env: Mapping[str, str] = HAND_ONLY, *, backend: str = "sqlite", **kwargs: Any) -> Orchestrator:
        index = next(started)
        db_url = None
        if backend == "postgres":
            cluster: PostgresCluster = request.getfixturevalue("postgres_cluster")
            db_url = cluster.create_database(f"m{next(_db_counter)}")
        data_dir = root / f"orchestrator-{index}"
        return start_orchestrator(
            registry, data_dir, db_url, extra_env=env, name=f"orchestrator-{index}", **kwargs
        )

    try:
        yield start
    finally:
        registry.kill_all()


@pytest.fixture(scope="module")
def served_orch(request: pytest.FixtureRequest, orchestrator_factory: OrchestratorFactory) -> Orchestrator:
    """One `spotswarm serve` shared by the tests of a module, with the module's ``ORCHESTRATOR_ENV``
    (default :data:`~tests.support.orchestrator.HAND_ONLY`: workers joined by hand, no import probe)."""
    return orchestrator_factory(getattr(request.module, "ORCHESTRATOR_ENV", HAND_ONLY))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A skipped check is not a pass: any skip fails the run."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if skipped and exitstatus == 0:
        reporter.write_line(f"FAILED: {skipped} test(s) skipped; spotswarm's suite allows no skips")
        session.exitstatus = 1
