"""Fixtures of the end-to-end tests: an orchestrator with the reconcile loop whose workers never leak."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import ProcessRegistry
from tests.support.runs import kill_local_workers


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
