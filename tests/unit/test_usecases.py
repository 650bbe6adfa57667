"""The use cases (orchestrator/domain/usecases.py): each checks once, commits, and signals "changed"
once after its commit (the heartbeat cache reloads then); a refused one signals nothing."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from orchestrator.db.models import Run
from orchestrator.db.session import Database
from orchestrator.domain.packages import PackageClaims
from orchestrator.domain.usecases import UseCases
from orchestrator.errors import InvalidRequest, RunExists
from orchestrator.progress import SwarmProgressCache
from orchestrator.storage.local import LocalCheckpointStore
from tests.support.specs import run_spec
from worker.protocol.runs import RunSpec, RunState

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def spec(**overrides: Any) -> RunSpec:
    return RunSpec.model_validate(run_spec(str(overrides.pop("name", "uc")), **overrides))


class Signals:
    """Counts the "changed" signals and what the database held when each came."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.states: list[RunState | None] = []

    def __call__(self) -> None:
        with self.db.read() as session:
            self.states.append(session.scalar(select(Run.state).where(Run.name == "uc")))


@pytest.mark.timeout(30)
def test_each_use_case_signals_changed_once_after_its_commit(db: Database, tmp_path: Path) -> None:
    signals = Signals(db)
    cases = UseCases(db, lambda: T0, LocalCheckpointStore(tmp_path / "store"), SwarmProgressCache(), signals)

    created = cases.create_run(spec(), {}, None, PackageClaims())
    assert created.name == "uc" and created.join_token
    assert signals.states == [RunState.pending]  # the signal came after the commit: the run was there

    cases.stop_run("uc", "enough")
    assert signals.states == [RunState.pending, RunState.stopped]  # no live worker: stopped at once


@pytest.mark.timeout(30)
def test_a_refused_create_is_checked_once_and_signals_nothing(db: Database, tmp_path: Path) -> None:
    signals = Signals(db)
    cases = UseCases(db, lambda: T0, LocalCheckpointStore(tmp_path / "store"), SwarmProgressCache(), signals)
    cases.create_run(spec(), {}, None, PackageClaims())

    with pytest.raises(RunExists):
        cases.create_run(spec(), {}, None, PackageClaims())
    with pytest.raises(InvalidRequest, match="secret_env: no value for API_KEY"):
        cases.create_run(spec(name="other", secret_env={"API_KEY": None}), {}, None, PackageClaims())
    assert len(signals.states) == 1
