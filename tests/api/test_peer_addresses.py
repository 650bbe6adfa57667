"""Peer-list poisoning: the addresses workers report in heartbeats become every new worker's initial peers.

One malformed address made p2pd refuse to start in every later worker (a run that can only fail); a
well-formed address of someone else's peer is an eclipse. The orchestrator keeps only dialable addresses
(``/ip4|ip6|dns*/<host>/tcp/<port>/p2p/<id>``) whose peer id is the one the worker's swarm token was
issued for; in a run without swarm admission there is no such id, and the form alone is checked.
The app in-process.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from tests.support import api
from tests.support.inprocess import InProcessOrchestrator as Orchestrator
from tests.support.specs import run_spec
from tests.support.waiting import wait_until
from tests.support.workers import heartbeat, new_public_key, register, swarm_token_peer_id
from worker.admission.tokens import peer_id_of

_names = itertools.count()
HTML = '/ip4/1.2.3.4/tcp/1"><img src=x>'


def create(api_app: Orchestrator, **overrides: Any) -> dict[str, Any]:
    with api_app.admin() as http:
        response = http.post(api.runs(), json=run_spec(f"pl-{next(_names)}", **overrides))
    assert response.status_code == 201, response.text
    return dict(response.json())


def worker_peers(api_app: Orchestrator, name: str) -> list[str]:
    with api_app.client() as http:
        return list(http.get(api.run_peers(name)).json()["worker_peers"])


@pytest.mark.timeout(120)
def test_only_dialable_addresses_of_the_workers_own_peer_reach_new_workers(api_app: Orchestrator) -> None:
    run = create(api_app)
    worker = register(api_app, run["join_token"])
    own = swarm_token_peer_id(api_app, worker)
    foreign = peer_id_of(new_public_key())
    good = [f"/ip4/10.1.2.3/tcp/4000/p2p/{own}", f"/dns4/worker-7.internal/tcp/4000/p2p/{own}"]
    bad = [
        HTML,
        "garbage",
        f"/ip4/10.1.2.3/tcp/4000/p2p/{foreign}",  # someone else's peer: an eclipse
        f"/ip4/10.1.2.3/udp/4000/p2p/{own}",  # not TCP
        "/ip4/10.1.2.3/tcp/4000",  # no peer id
        f"/ip4/10.1.2.3/tcp/99999/p2p/{own}",  # no such port
    ]
    heartbeat(api_app, worker, visible_maddrs=bad[:3] + good + bad[3:])
    wait_until(lambda: worker_peers(api_app, run["name"]), 10, message="the heartbeat is written")
    assert worker_peers(api_app, run["name"]) == good
    newcomer = register(api_app, run["join_token"])
    assert newcomer["initial_peers"] == api_app.peers() + good


@pytest.mark.timeout(120)
def test_a_worker_without_a_swarm_token_announces_no_address(api_app: Orchestrator) -> None:
    run = create(api_app)
    worker = register(api_app, run["join_token"])
    stranger = peer_id_of(new_public_key())
    heartbeat(api_app, worker, visible_maddrs=[f"/ip4/10.1.2.3/tcp/4000/p2p/{stranger}"], samples=5)
    with api_app.client() as http:
        wait_until(
            lambda: http.get(api.run(run["name"])).json()["reported"]["samples_total"] == 5,
            10,
            message="the heartbeat is written",
        )
    assert worker_peers(api_app, run["name"]) == []


@pytest.mark.timeout(120)
def test_a_run_without_swarm_admission_keeps_only_well_formed_addresses(api_app: Orchestrator) -> None:
    """No swarm token, so no peer id to check against: any peer may join such a swarm anyway, so
    announcing one is no more than joining; malformed addresses are still dropped."""
    run = create(api_app, strategy_options={"swarm_admission": False})  # no training: the opt-out's own rule
    worker = register(api_app, run["join_token"])
    anyone = f"/ip4/10.1.2.3/tcp/4000/p2p/{peer_id_of(new_public_key())}"
    heartbeat(api_app, worker, visible_maddrs=[HTML, anyone, "garbage"])
    wait_until(lambda: worker_peers(api_app, run["name"]), 10, message="the heartbeat is written")
    assert worker_peers(api_app, run["name"]) == [anyone]
