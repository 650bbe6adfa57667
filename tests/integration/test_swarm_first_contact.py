"""A run's first peers are answered by the orchestrator's DHT peer, whatever the timing.

The orchestrator's DHT peer refuses peers without a swarm token unless it knows their run opted out of
admission, and a peer refused at its first contact cannot join the swarm through it (the agent tries
three times, then gives up). The peer used to learn which runs opted out only every
``dht_refresh_interval_s``: a run's workers that knocked before that were refused. Here that interval is
10 minutes, so only the push that comes with a registration can let them in.

With admission on, a worker whose first contact gets no answer (the orchestrator's DHT process stopped
for a moment) tries again and joins the same swarm as the other worker.

Real `spotswarm serve` (no reconcile loop) and peers started as the agent starts its DHT
(``tests/programs/joining_peer.py``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import api
from tests.support.orchestrator import NO_RECONCILE, Orchestrator
from tests.support.processes import ManagedProcess, ProcessRegistry
from tests.support.specs import run_spec
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.swarm]
JOIN_S = 120.0  # two peers importing hivemind and starting their daemons on a busy 2-core machine
ORCHESTRATOR_ENV = {
    **NO_RECONCILE,
    "SPOTSWARM_CHECK_IMPORTS": "false",
    "SPOTSWARM_DHT_REFRESH_INTERVAL_S": "600",  # the periodic push of opted-out runs comes too late
}


def create_run(orch: Orchestrator, name: str, **options: Any) -> dict[str, Any]:
    spec = run_spec(name, strategy_options=options)
    with orch.admin() as http:
        return dict(http.post(api.runs(), json=spec, timeout=120).raise_for_status().json())


def register(orch: Orchestrator, join_token: str) -> dict[str, Any]:
    with orch.client(join_token) as http:
        return dict(http.post(api.register(), json={"hostname": "peer"}).raise_for_status().json())


def start_peers(processes: ProcessRegistry, tmp: Path, count: int) -> list[tuple[ManagedProcess, Path]]:
    """Peer processes that import everything, then wait for their config (see :func:`join`)."""
    started = []
    for i in range(1, count + 1):
        args = [sys.executable, "-m", "tests.programs.joining_peer", str(tmp / f"peer-{i}.json")]
        started.append(
            (
                processes.start(f"peer-{i}", [*args, str(tmp / f"peer-{i}-out.json")], preloaded=True),
                tmp / f"peer-{i}.json",
            )
        )
    wait_until(lambda: all("ready" in proc.log() for proc, _ in started), JOIN_S, message="peers imported")
    return started


def join(config_path: Path, registration: dict[str, Any], admission: dict[str, Any] | None) -> Path:
    """Hand a waiting peer its registration: it joins the swarm now. Returns where it reports."""
    config = {
        "initial_peers": registration["initial_peers"],
        "swarm_id": registration["swarm_id"],
        "stop_file": str(config_path.parent / "stop"),
        "admission": admission,
    }
    tmp = config_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(config))
    tmp.replace(config_path)
    return config_path.with_name(config_path.stem + "-out.json")


def outcome(out: Path) -> dict[str, Any] | None:
    return json.loads(out.read_text()) if out.exists() else None


def settled(outs: list[Path], peers: int) -> list[dict[str, Any]] | None:
    """The peers' reports once every peer has seen ``peers`` peers or one could not join; else None."""
    results = [outcome(out) for out in outs]
    done = [r for r in results if r is not None]
    if len(done) == len(outs) and all(r["joined"] and r["most_peers_seen"] >= peers for r in done):
        return done
    return done if any(not r["joined"] for r in done) else None


def assert_one_swarm(outs: list[Path], peers: int) -> None:
    results = wait_until(lambda: settled(outs, peers), JOIN_S, interval_s=0.5, message="the peers join")
    assert all(r["joined"] for r in results), f"a peer could not join: {results}"


@pytest.mark.timeout(240)
def test_peers_of_an_opted_out_run_are_answered_from_their_first_contact(
    served_orch: Orchestrator, processes: ProcessRegistry, tmp_path: Path
) -> None:
    started = start_peers(processes, tmp_path, 2)
    run = create_run(served_orch, "open-first", swarm_admission=False)
    outs = [join(config, register(served_orch, run["join_token"]), None) for _, config in started]
    try:
        assert_one_swarm(outs, 2)
    finally:
        (tmp_path / "stop").touch()
    for proc, _ in started:
        assert "joining the swarm failed" not in proc.log(), proc.log()[-2000:]


@pytest.mark.timeout(240)
def test_an_admitted_worker_whose_first_contact_fails_joins_the_same_swarm(
    served_orch: Orchestrator, processes: ProcessRegistry, tmp_path: Path
) -> None:
    started = start_peers(processes, tmp_path, 2)
    run = create_run(served_orch, "admitted-first")
    registrations = [register(served_orch, run["join_token"]) for _ in started]
    dht_pid = int(json.loads((served_orch.data_dir / "dht.pid").read_text())["pid"])
    os.kill(dht_pid, signal.SIGSTOP)  # the orchestrator's DHT peer answers nobody for a moment
    try:
        outs = []
        for i, ((_, config), registration) in enumerate(zip(started, registrations, strict=True)):
            admission = {
                "url": served_orch.url,
                "worker_id": registration["worker_id"],
                "worker_token": registration["worker_token"],
                "worker_dir": str(tmp_path / f"worker-{i}"),
            }
            outs.append(join(config, registration, admission))
        wait_until(
            lambda: all("joining the swarm failed" in proc.log() for proc, _ in started),
            JOIN_S,
            message="each peer's first contact went unanswered",
        )
    finally:
        os.kill(dht_pid, signal.SIGCONT)
    try:
        assert_one_swarm(outs, 2)
    finally:
        (tmp_path / "stop").touch()
