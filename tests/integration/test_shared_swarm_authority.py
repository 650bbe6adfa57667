"""Orchestrators sharing a database sign swarm tokens with one key, or the second one does not start.

A worker trusts only the authority key of its first swarm token. Two orchestrators on one database (the
HA set-up) with a key each would admit two halves of a run's swarm that refuse each other's averaging
calls, and each orchestrator's token renewals would be refused by the other's workers.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from orchestrator.swarm.admission import load_or_create_key
from tests.support import api
from tests.support.orchestrator import NO_RECONCILE, Orchestrator, start_orchestrator
from tests.support.processes import ProcessRegistry


def authority_key(orch: Orchestrator) -> str:
    return str(httpx.get(orch.url + api.swarm_auth(), timeout=10).json()["authority_public_key"])


@pytest.mark.timeout(300)
def test_a_second_orchestrator_with_its_own_key_refuses_to_start_and_one_with_the_shared_key_starts(
    processes: ProcessRegistry, tmp_path: Path
) -> None:
    database = f"sqlite:///{tmp_path / 'shared.db'}"
    first = start_orchestrator(processes, tmp_path / "a", database, NO_RECONCILE, name="first")

    with pytest.raises(RuntimeError) as refused:
        start_orchestrator(processes, tmp_path / "b", database, NO_RECONCILE, name="second-own-key")
    log = str(refused.value)
    assert "exited with 1" in log and "Traceback" not in log
    assert f"the swarm authority key {tmp_path / 'b' / 'swarm_authority.pem'} is not the one" in log
    assert "SPOTSWARM_SWARM_AUTHORITY_KEY_FILE" in log

    shared_key = tmp_path / "a" / "swarm_authority.pem"
    env = {**NO_RECONCILE, "SPOTSWARM_SWARM_AUTHORITY_KEY_FILE": str(shared_key)}
    second = start_orchestrator(processes, tmp_path / "c", database, env, name="second-shared-key")
    assert authority_key(second) == authority_key(first)
    assert not (tmp_path / "c" / "swarm_authority.pem").exists()


def test_the_key_file_setting_names_an_existing_key(tmp_path: Path) -> None:
    made = load_or_create_key(tmp_path / "authority.pem")
    assert load_or_create_key(tmp_path / "authority.pem").private_numbers() == made.private_numbers()
