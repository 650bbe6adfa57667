"""Which runs' token-less peers the orchestrator's DHT peer serves (orchestrator/swarm/admission.py), on
a fresh SQLite database: the peer starts knowing the active runs that opted out, and a registration of an
opted-out run pushes the set at once unless the peer has it already."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from orchestrator.db.session import Database
from orchestrator.domain import runs
from orchestrator.swarm.admission import SwarmAdmission
from orchestrator.swarm.peer_authorizer import OrchestratorPeerAuthorizer, peer_dht_options
from worker.protocol.runs import RunSpec, RunState

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def new_run(db: Database, name: str, admission: bool, state: RunState = RunState.pending) -> str:
    options: dict[str, Any] = {} if admission else {"swarm_admission": False}
    spec = RunSpec.model_validate(
        {
            "name": name,
            "module": "a.b:C",
            "datamodule": "a.b:D",
            "target_batch_size": 64,
            "batch_size": 8,
            "strategy_options": options,
        }
    )
    with db.begin() as session:
        run, _ = runs.create_run(session, spec, T0)
        run.state = state.value
        return str(run.swarm_id)


def test_the_dht_peer_starts_serving_the_active_runs_that_opted_out(db: Database, tmp_path: Path) -> None:
    opted_out = new_run(db, "open", admission=False, state=RunState.running)
    new_run(db, "admitted", admission=True)
    new_run(db, "open-but-over", admission=False, state=RunState.stopped)
    admission = SwarmAdmission.from_key_file(tmp_path / "authority.pem", 600.0)

    open_swarms = admission.serve_from_start(db)
    authorizer = peer_dht_options(admission.authority, tmp_path / "identity.key", open_swarms)["authorizer"]

    assert isinstance(authorizer, OrchestratorPeerAuthorizer)
    assert authorizer.open_swarms == frozenset({opted_out})
    assert admission.open_swarms == frozenset({opted_out})


def test_a_registration_of_an_opted_out_run_pushes_it_once(db: Database, tmp_path: Path) -> None:
    admission = SwarmAdmission.from_key_file(tmp_path / "authority.pem", 600.0)
    admission.serve_from_start(db)  # the peer starts: no run opted out yet
    pushed: list[frozenset[str]] = []
    admission.bind_peer(pushed.append)
    opted_out = new_run(db, "open", admission=False)

    admission.serve_opted_out(db, opted_out)
    admission.serve_opted_out(db, opted_out)  # the peer has it: nothing to push

    assert pushed == [frozenset({opted_out})]
    assert admission.open_swarms == frozenset({opted_out})
