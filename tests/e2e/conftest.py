"""Fixtures of the end-to-end tests: an orchestrator with the reconcile loop whose workers never leak, of
the test's own (``loop_data_dir``) or shared (``loop_orch``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.orchestrator import Orchestrator
from tests.support.processes import ProcessRegistry
from tests.support.runs import kill_local_workers, runs_stopped_after, start_loop_orchestrator


@pytest.fixture
def loop_data_dir(tmp_path: Path, processes: ProcessRegistry) -> Iterator[Path]:
    """The data dir of a test's orchestrator; every local worker started under it is killed at the end.

    The orchestrator goes first (so its loop cannot launch replacements), then the workers.
    """
    data_dir = tmp_path / "orch"
    try:
        yield data_dir
    finally:
        processes.kill_all()
        kill_local_workers(data_dir)


@pytest.fixture(scope="session")
def shared_loop_orchestrator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Orchestrator]:
    """One `spotswarm serve` with the reconcile loop at the default test settings, started at its first
    use and killed (with every local worker it started) at the end of the session."""
    root = tmp_path_factory.mktemp("shared-loop")
    registry = ProcessRegistry(root)
    data_dir = root / "orch"
    try:
        yield start_loop_orchestrator(registry, data_dir)
    finally:
        registry.kill_all()
        kill_local_workers(data_dir)


@pytest.fixture
def loop_orch(shared_loop_orchestrator: Orchestrator) -> Iterator[Orchestrator]:
    """The shared orchestrator with the reconcile loop, for a test that needs no setting of its own and
    does not stop or restart the orchestrator: each test saves a server start (seconds of CPU). The runs
    a test made are stopped when it ends and their workers killed, so the next test shares nothing
    live; run names must differ between tests (a stopped run keeps its name)."""
    with runs_stopped_after(shared_loop_orchestrator) as orch:
        yield orch
