"""Fixtures of the API tests: each test gets its own app in-process (``create_app`` with a null DHT, its
lifespan run) on its own database.

A module names the settings of its app in ``ORCHESTRATOR_ENV`` (``SPOTSWARM_*`` variables; default
:data:`~tests.support.orchestrator.HAND_ONLY`: workers joined by hand, no import probe), runs on
PostgreSQL as well with ``pytestmark = pytest.mark.parametrize("backend", BOTH_BACKENDS, indirect=True)``,
and checks run specs' imports with ``IMPORT_CHECKS = True``: one import probe (a process with Lightning
imported, seconds to start) then serves every app of the session, put in place of each app's own
(``app.dependency_overrides``), so a test pays only for its checks.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.api.deps import get_imports
from orchestrator.importcheck.checker import ImportChecker, RuntimeLimits
from tests.support.inprocess import InProcessOrchestrator, inprocess_orchestrator, settings_from_env
from tests.support.orchestrator import HAND_ONLY, TEST_ENV

BOTH_BACKENDS = ["sqlite", "postgres"]


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """The database of the test's app: ``sqlite`` unless the test is parametrized indirectly."""
    return str(getattr(request, "param", "sqlite"))


@pytest.fixture
def db_url(request: pytest.FixtureRequest, backend: str) -> str | None:
    """A fresh database on the throwaway PostgreSQL cluster, or None (SQLite in the data dir)."""
    return str(request.getfixturevalue("postgres_url")) if backend == "postgres" else None


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
def orch(
    request: pytest.FixtureRequest, tmp_path: Path, db_url: str | None
) -> Iterator[InProcessOrchestrator]:
    """The test's own app, with the module's ``ORCHESTRATOR_ENV``; stopped when the test ends."""
    env = {**getattr(request.module, "ORCHESTRATOR_ENV", HAND_ONLY)}
    checker = (
        request.getfixturevalue("import_checker") if getattr(request.module, "IMPORT_CHECKS", False) else None
    )
    if checker is not None:
        env["SPOTSWARM_CHECK_IMPORTS"] = "false"  # the app's own probe; the shared one answers instead
    with inprocess_orchestrator(tmp_path / "data", db_url, env) as app:
        if checker is not None:
            app.app.dependency_overrides[get_imports] = lambda: checker
        yield app
