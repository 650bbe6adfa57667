"""Fixtures of the API tests: each test gets its own app in-process (``create_app`` with a null DHT, its
lifespan run) on its own database.

A module names the settings of its app in ``ORCHESTRATOR_ENV`` (``SPOTSWARM_*`` variables; default
:data:`~tests.support.orchestrator.HAND_ONLY`: workers joined by hand, no import probe), runs on
PostgreSQL as well with ``pytestmark = pytest.mark.parametrize("backend", BOTH_BACKENDS, indirect=True)``,
and checks run specs' imports with ``IMPORT_CHECKS = True``: one import probe (a process with Lightning
imported, seconds to start) then serves every app of the session, put in place of each app's own
(``app.dependency_overrides``), so a test pays only for its checks.

Each app starts on a data dir as a restart finds it (:func:`~tests.support.inprocess.seed_data_dir`): a
database already at the newest migration (SQLite: a copy of a file migrated once; PostgreSQL: a copy of a
template database migrated once) and a swarm authority key made once. A first start's migrations and
key are the subprocess tests' part (tests/integration/test_db_migrations.py, every ``spotswarm serve``);
here they cost a third of each test's time and test no route.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.api.deps import get_imports
from orchestrator.importcheck.checker import ImportChecker, RuntimeLimits
from tests.support.inprocess import (
    InProcessOrchestrator,
    SeedFiles,
    inprocess_orchestrator,
    migrated_database,
    seed_data_dir,
    settings_from_env,
)
from tests.support.orchestrator import HAND_ONLY, TEST_ENV
from tests.support.postgres import PostgresCluster

BOTH_BACKENDS = ["sqlite", "postgres"]
#: the PostgreSQL database every test's database copies
TEMPLATE_DB = "api_template"
_api_databases = itertools.count()


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """The database of the test's app: ``sqlite`` unless the test is parametrized indirectly."""
    return str(getattr(request, "param", "sqlite"))


@pytest.fixture(scope="session")
def seed_files(tmp_path_factory: pytest.TempPathFactory) -> SeedFiles:
    """The SQLite database and the swarm authority key every test's data dir starts with."""
    return SeedFiles.create(tmp_path_factory.mktemp("api-seed"))


@pytest.fixture(scope="session")
def postgres_template(postgres_cluster: PostgresCluster) -> str:
    """The name of a PostgreSQL database at the newest migration, for each test to copy."""
    migrated_database(postgres_cluster.create_database(TEMPLATE_DB))
    return TEMPLATE_DB


@pytest.fixture
def db_url(request: pytest.FixtureRequest, backend: str) -> str | None:
    """A fresh database at the newest migration on the throwaway PostgreSQL cluster, or None (SQLite in
    the data dir)."""
    if backend != "postgres":
        return None
    cluster: PostgresCluster = request.getfixturevalue("postgres_cluster")
    template = request.getfixturevalue("postgres_template")
    return cluster.create_database(f"api{next(_api_databases)}", template=template)


@pytest.fixture(scope="session")
def import_checker() -> Iterator[ImportChecker]:
    """The import check as ``create_app`` builds it from the default settings, started once."""
    settings = settings_from_env(TEST_ENV)
    limits = RuntimeLimits(settings.installer, settings.install_timeout_s, settings.package_max_bytes)
    checker = ImportChecker(settings.import_timeout_s, settings.worker_env, limits)
    checker.warm_up()
    try:
        yield checker
    finally:
        checker.close()


@pytest.fixture
def api_app(
    request: pytest.FixtureRequest, tmp_path: Path, db_url: str | None, seed_files: SeedFiles
) -> Iterator[InProcessOrchestrator]:
    """The test's own app, with the module's ``ORCHESTRATOR_ENV``, on a seeded data dir; stopped when
    the test ends."""
    env = {**getattr(request.module, "ORCHESTRATOR_ENV", HAND_ONLY)}
    checker = (
        request.getfixturevalue("import_checker") if getattr(request.module, "IMPORT_CHECKS", False) else None
    )
    if checker is not None:
        env["SPOTSWARM_CHECK_IMPORTS"] = "false"  # the app's own probe; the shared one answers instead
    data_dir = seed_data_dir(tmp_path / "data", seed_files, sqlite=db_url is None)
    with inprocess_orchestrator(data_dir, db_url, env) as app:
        if checker is not None:
            app.app.dependency_overrides[get_imports] = lambda: checker
        yield app
