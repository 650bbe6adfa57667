"""High availability on PostgreSQL: two real orchestrators on one database behind one address (a failover
proxy), each with its own data dir and ports. Only the leader's reconcile loop launches; when the leader is
killed (-9) the other takes over within a tick or two, and the worker launched by the first one keeps
training through the other: nothing is launched twice."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from orchestrator.swarm.admission import load_or_create_key
from tests.support import api
from tests.support.failover_proxy import FailoverProxy
from tests.support.orchestrator import LOOP_ENV, Orchestrator, start_orchestrator
from tests.support.ports import free_ports
from tests.support.processes import ProcessRegistry
from tests.support.runs import ROUNDS, RunReader, admin_post, digits_run, kill_local_workers
from tests.support.waiting import BOOT_S, wait_until

pytestmark = [pytest.mark.swarm, pytest.mark.postgres]
TAKEOVER_BOUND_S = 10.0  # a reconcile interval (0.5 s here) and a slow, busy machine
LEADER_LINE = "this orchestrator is the leader"


def launches(data_dir: Path) -> list[str]:
    """Request ids the local launcher of ``data_dir`` ever started."""
    state = data_dir / "launcher-local"
    return (
        sorted(json.loads(p.read_text())["request_id"] for p in state.glob("*.json"))
        if state.exists()
        else []
    )


@pytest.fixture
def two_dirs(tmp_path: Path, processes: ProcessRegistry) -> Iterator[tuple[Path, Path]]:
    dirs = (tmp_path / "orch-a", tmp_path / "orch-b")
    try:
        yield dirs
    finally:
        processes.kill_all()
        for data_dir in dirs:
            kill_local_workers(data_dir)


@pytest.mark.timeout(420)
def test_only_the_leader_launches_and_the_standby_takes_over_without_relaunching(
    processes: ProcessRegistry, postgres_url: str, two_dirs: tuple[Path, Path]
) -> None:
    *ports, proxy_port = free_ports(3)
    proxy = FailoverProxy(proxy_port, ports)
    # one swarm authority for both (docs/guides/postgresql-ha.md): made here, as an operator copies it
    authority = two_dirs[0].parent / "swarm_authority.pem"
    load_or_create_key(authority)
    env = {
        **LOOP_ENV,
        "SPOTSWARM_PUBLIC_URL": proxy.url,
        "SPOTSWARM_SWARM_AUTHORITY_KEY_FILE": str(authority),
    }
    try:
        with ThreadPoolExecutor(2) as pool:
            started = list(
                pool.map(
                    lambda i: start_orchestrator(
                        processes,
                        two_dirs[i],
                        postgres_url,
                        extra_env=env,
                        admin_token="ssa_ha-test-admin-token",
                        port=ports[i],
                        name=f"orchestrator-{'ab'[i]}",
                    ),
                    range(2),
                )
            )
        leader, standby = _roles(started)
        reader = RunReader(leader, "ha")
        spec = digits_run("ha", desired_workers=1, strategy_options=dict(ROUNDS))
        admin_post(leader, api.runs(), spec)
        # training, not only registered: past joining the swarm through the leader's DHT peer (a worker
        # still starting when the leader dies joins through the new leader's: test_dht_bootstrap_retry)
        worker = wait_until(
            lambda: next((w for w in reader.running() if w["samples"] > 0), None),
            BOOT_S,
            message="the leader's worker trains",
        )
        assert launches(leader.data_dir) == [worker["request_id"]] and launches(standby.data_dir) == []

        leader.kill()
        killed_at = time.monotonic()
        wait_until(lambda: LEADER_LINE in standby.proc.log(), 60, interval_s=0.1, message="takeover")
        took_s = time.monotonic() - killed_at
        assert took_s < TAKEOVER_BOUND_S, took_s

        reader = RunReader(standby, "ha")
        beat = worker["last_heartbeat_at"]
        wait_until(
            lambda: (w := reader.workers()[0])["last_heartbeat_at"] > beat and w["state"] == "running",
            60,
            message="the worker heartbeats through the proxy to the new leader",
        )
        admin_post(standby, api.run_stop("ha"))  # only a live reconcile loop can finish stopping
        wait_until(lambda: reader.run()["state"] == "stopped", 120, message="the new leader stops the run")
    finally:
        proxy.close()
    rows = reader.workers()
    assert [w["request_id"] for w in rows] == [worker["request_id"]], "a worker was launched twice"
    assert launches(standby.data_dir) == []
    launched = [e for e in reader.events() if e["kind"] == "worker.launched"]
    assert len(launched) == 1, launched


def _roles(orchestrators: list[Orchestrator]) -> tuple[Orchestrator, Orchestrator]:
    """(leader, standby), once each has logged its role."""

    def logged() -> bool:
        return all(LEADER_LINE in o.proc.log() or "standing by" in o.proc.log() for o in orchestrators)

    wait_until(logged, 30, message="both orchestrators know their role")
    leaders = [o for o in orchestrators if LEADER_LINE in o.proc.log()]
    assert len(leaders) == 1, [o.proc.log()[-2000:] for o in orchestrators]
    return leaders[0], next(o for o in orchestrators if o is not leaders[0])
