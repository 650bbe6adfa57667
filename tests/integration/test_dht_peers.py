"""The orchestrator's DHT peer: plain hivemind peers meet through it, and it reads a run's swarm progress."""

from __future__ import annotations

import logging
from typing import Any

import hivemind
import pytest
from hivemind.optim.progress_tracker import ProgressTracker
from hivemind.utils import get_dht_time
from hivemind.utils.crypto import RSAPrivateKey

from tests.support import api
from tests.support.dht_reads import read_latest
from tests.support.orchestrator import HAND_ONLY, Orchestrator
from tests.support.specs import run_spec
from tests.support.waiting import wait_until
from worker.strategy.dht import start_dht

pytestmark = pytest.mark.swarm


# plain hivemind peers without swarm tokens: the orchestrator's DHT must admit anyone here
# (swarm admission is tested in test_swarm_admission.py)
ORCHESTRATOR_ENV = {**HAND_ONLY, "SPOTSWARM_SWARM_ADMISSION": "false"}


def plain_peer(initial_peers: list[str], **kwargs: Any) -> hivemind.DHT:
    return hivemind.DHT(
        initial_peers=initial_peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True, **kwargs
    )


@pytest.mark.timeout(180)
def test_plain_peers_store_and_read_a_key_through_the_orchestrator(served_orch: Orchestrator) -> None:
    peers = served_orch.peers()
    assert peers and all(p.startswith("/ip4/127.0.0.1/tcp/") and "/p2p/" in p for p in peers)
    # Client-mode peers store nothing themselves: the record can only live on the orchestrator's peer.
    writer = plain_peer(peers, client_mode=True)
    reader = plain_peer(peers, client_mode=True)
    try:
        expiration = get_dht_time() + 60
        assert writer.store("spotswarm-test-key", "hello", expiration)
        found = wait_until(lambda: read_latest(reader, "spotswarm-test-key", attempts=1), 30)
        assert found.value == "hello"
    finally:
        writer.shutdown()
        reader.shutdown()


@pytest.mark.timeout(180)
def test_run_shows_swarm_progress_published_by_progress_trackers(served_orch: Orchestrator) -> None:
    with served_orch.admin() as http:
        created = http.post(api.runs(), json=run_spec("dht-progress", target_batch_size=100)).json()
    swarm_id = created["swarm_id"]
    assert created["swarm"] is None
    peers = served_orch.peers()
    dhts = [plain_peer(peers), plain_peer(peers)]
    trackers = [
        ProgressTracker(dht, swarm_id, 100, private_key=RSAPrivateKey(), metadata_expiration=30, start=True)
        for dht in dhts
    ]
    try:
        trackers[0].report_local_progress(local_epoch=3, samples_accumulated=24)
        trackers[1].report_local_progress(local_epoch=3, samples_accumulated=16)

        def swarm() -> dict[str, Any]:
            with served_orch.client() as http:
                progress = http.get(api.run("dht-progress")).json()["swarm"]
            return dict(progress) if progress and progress["num_peers"] == 2 else {}

        progress = wait_until(swarm, 60, interval_s=0.5)
        assert progress["epoch"] == 3 and progress["samples_accumulated"] == 40
        assert progress["target_batch_size"] == 100 and progress["num_clients"] == 0
    finally:
        for tracker in trackers:
            tracker.shutdown(timeout=5)
        for dht in dhts:
            dht.shutdown()


@pytest.mark.timeout(180)
def test_a_worker_drops_unusable_initial_peers_and_joins_through_the_rest(
    served_orch: Orchestrator, caplog: pytest.LogCaptureFixture
) -> None:
    """p2pd refuses to start when any bootstrap address does not parse: before, one bad address in the
    run's peer list made every new worker fail. Now the bad ones are dropped with a warning."""
    bad = ['/ip4/1.2.3.4/tcp/1"><img src=x>', "garbage", "/ip4/1.2.3.4/tcp/1"]
    with caplog.at_level(logging.WARNING, logger="worker.protocol.peer_addresses"):
        dht = start_dht(initial_peers=[*bad, *served_orch.peers()], host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    try:
        other = plain_peer(served_orch.peers(), client_mode=True)
        try:
            assert dht.store("spotswarm-bad-peers", "joined", get_dht_time() + 60)
            assert (
                wait_until(lambda: read_latest(other, "spotswarm-bad-peers", attempts=1), 30).value
                == "joined"
            )
        finally:
            other.shutdown()
    finally:
        dht.shutdown()
    dropped = [r.getMessage() for r in caplog.records if "initial peer" in r.getMessage()]
    assert len(dropped) == len(bad) and all(any(b in m for m in dropped) for b in bad), dropped
