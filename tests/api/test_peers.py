"""``/api/v1/runs/{name}/peers``: the orchestrator's addresses first, then the freshest workers', bounded;
the read rule (reads need the admin token here; a run's peers also take its join token). The app
in-process."""

from __future__ import annotations

import hashlib
from typing import Any

import base58
import pytest

from tests.support import api
from tests.support.inprocess import InProcessOrchestrator as Orchestrator
from tests.support.operability import OPERABILITY_ENV, admin_get, create, join
from tests.support.waiting import wait_until
from worker.protocol.workers import DeregisterReason

ORCHESTRATOR_ENV = OPERABILITY_ENV


def maddrs(index: int) -> list[str]:
    """Three addresses of worker ``index``'s peer (a well-formed peer id: a SHA-256 multihash)."""
    peer_id = base58.b58encode(bytes([0x12, 0x20]) + hashlib.sha256(str(index).encode()).digest()).decode()
    return [f"/ip4/10.0.0.{index}/tcp/{4000 + port}/p2p/{peer_id}" for port in range(3)]


@pytest.mark.timeout(120)
def test_run_peers_are_the_orchestrator_then_the_freshest_workers_bounded(api_app: Orchestrator) -> None:
    # no training here; admission off so the made-up addresses need no swarm token of their peer ids
    name, join_token = create(api_app, max_workers=10, strategy_options={"swarm_admission": False})
    pool = [join(api_app, join_token) for _ in range(10)]
    for index, client in enumerate(pool):  # heartbeats in order: the last one is the freshest
        client.beat(visible_maddrs=maddrs(index))

    def peers() -> dict[str, Any]:
        with api_app.client(join_token) as http:  # a run's peers also accept its join token
            return dict(http.get(api.run_peers(name)).json())

    listed = wait_until(lambda: (p := peers())["worker_peers"][:3] == maddrs(9) and p, 15)
    assert listed["orchestrator_peers"] == admin_get(api_app, api.peers())["orchestrator_peers"]
    assert listed["initial_peers"] == listed["orchestrator_peers"] + listed["worker_peers"]
    expected = [m for index in range(9, -1, -1) for m in maddrs(index)][:16]  # at most 16 addresses
    assert listed["worker_peers"] == expected

    pool[0].beat(visible_maddrs=maddrs(0))  # worker 0 speaks again: it leads the list
    wait_until(lambda: peers()["worker_peers"][:3] == maddrs(0), 15)
    pool[0].leave(DeregisterReason.stopped)
    wait_until(lambda: not set(maddrs(0)) & set(peers()["worker_peers"]), 15, message="left: unlisted")
    with api_app.client() as anonymous:
        assert anonymous.get(api.run_peers(name)).status_code == 401
