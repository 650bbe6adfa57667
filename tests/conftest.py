"""Shared fixtures: processes that are always killed, a throwaway PostgreSQL, and no silent skips."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.postgres import PostgresCluster
from tests.support.processes import ProcessRegistry

# Fixtures of tests/support modules, for every test: the moto server standing in for AWS.
pytest_plugins = ["tests.support.aws"]

_db_counter = itertools.count()


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
    """One PostgreSQL 15 server for the whole test run, started here and stopped at the end."""
    cluster = PostgresCluster()
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def postgres_url(postgres_cluster: PostgresCluster) -> str:
    """A fresh, empty database on the throwaway cluster for one test."""
    return postgres_cluster.create_database(f"t{next(_db_counter)}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A skipped check is not a pass: any skip fails the run."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if skipped and exitstatus == 0:
        reporter.write_line(f"FAILED: {skipped} test(s) skipped; spotswarm's suite allows no skips")
        session.exitstatus = 1
