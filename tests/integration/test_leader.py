"""Leader election of the reconcile loop (orchestrator/reconciler/leader.py) on a real PostgreSQL and on
SQLite files: one leader at a time, a standby takes over once the leader releases, dies (kill -9) or loses its
database session."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from orchestrator.reconciler.leader import (
    AlwaysLeader,
    FileLockLeader,
    LeaderElection,
    PostgresAdvisoryLeader,
    leader_election,
)
from tests.support.postgres import PostgresCluster
from tests.support.processes import ProcessRegistry
from tests.support.waiting import wait_until

HOLDER = """
import sys, time
from orchestrator.reconciler.leader import leader_election
election = leader_election(sys.argv[1])
while not election.check():
    time.sleep(0.1)
print("leading", flush=True)
time.sleep(600)
"""


def _holder(processes: ProcessRegistry, url: str) -> None:
    """A process that becomes the leader and then does nothing until killed."""
    proc = processes.start("holder", [sys.executable, "-c", HOLDER, url])
    wait_until(lambda: "leading" in proc.log(), 60, message="the other process leads")


def _takes_over_after_kill(processes: ProcessRegistry, url: str, standby: LeaderElection) -> float:
    _holder(processes, url)
    assert not standby.check()
    killed_at = time.monotonic()
    processes.kill_all()  # kill -9 of the leader
    wait_until(standby.check, 20, interval_s=0.1, message="the standby takes over")
    return time.monotonic() - killed_at


def test_election_follows_the_database_kind(tmp_path: Path) -> None:
    assert isinstance(leader_election("sqlite:///:memory:"), AlwaysLeader)
    assert isinstance(leader_election(f"sqlite:///{tmp_path}/x.db"), FileLockLeader)
    assert isinstance(leader_election("postgresql+psycopg://u@h/d"), PostgresAdvisoryLeader)
    with pytest.raises(ValueError, match="no leader election"):
        leader_election("mysql://u@h/d")


@pytest.mark.timeout(120)
def test_sqlite_file_lock_has_one_leader_and_a_standby_takes_over(
    processes: ProcessRegistry, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'spotswarm.db'}"
    first, second = leader_election(url), leader_election(url)
    assert first.check() and first.check()
    assert not second.check()
    first.release()
    assert second.check() and not first.check()
    second.release()
    took_s = _takes_over_after_kill(processes, url, leader_election(url))
    assert took_s < 2, took_s


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_postgres_advisory_lock_has_one_leader_and_a_standby_takes_over(
    processes: ProcessRegistry, postgres_url: str
) -> None:
    first, second = leader_election(postgres_url), leader_election(postgres_url)
    try:
        assert first.check() and first.check()
        assert not second.check()
        first.release()
        assert second.check() and not first.check()
    finally:
        first.release()
        second.release()
    standby = leader_election(postgres_url)
    try:
        took_s = _takes_over_after_kill(processes, postgres_url, standby)
    finally:
        standby.release()
    assert took_s < 3, took_s  # the server ends the dead session (and its lock) as its socket closes


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_a_leader_whose_database_restarts_steps_down_then_one_leads_again(
    own_postgres_cluster: PostgresCluster,
) -> None:
    cluster = own_postgres_cluster
    url = cluster.create_database("leader")
    first, second = leader_election(url), leader_election(url)
    assert first.check() and not second.check()
    cluster.stop_server()
    assert not first.check() and not second.check()  # nobody leads without the database
    cluster.start_server()
    wait_until(lambda: first.check() or second.check(), 30, message="a leader again")
    assert first.check() + second.check() == 1
    first.release()
    second.release()
