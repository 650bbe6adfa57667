"""A worker whose bootstrap peer is gone joins through the fresh peers the orchestrator gives it.

With two orchestrators, the leader can die (-9) between a worker's registration (which named the leader's
DHT as its initial peer) and that worker's DHT start. ``p2pd`` then fails to start at all ("failed to
connect to bootstrap peers", a ``P2PDaemonError``, not hivemind's "bootstrap failed"), and the worker
used to fail its training; the agent now asks for fresh peers (the new leader's) and tries again. Real
DHTs on 127.0.0.1: the gone peer is one that ran and was shut down.
"""

from __future__ import annotations

import hivemind
import pytest
from hivemind.utils import get_dht_time

from worker.agent.training import start_swarm_dht_retrying

pytestmark = pytest.mark.swarm
LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


@pytest.mark.timeout(120)
def test_a_worker_whose_bootstrap_peer_is_gone_joins_through_fresh_peers() -> None:
    gone = hivemind.DHT(start=True, host_maddrs=LOOPBACK)
    gone_maddrs = [str(m) for m in gone.get_visible_maddrs()]
    gone.shutdown()
    live = hivemind.DHT(start=True, host_maddrs=LOOPBACK)
    joined = None
    refreshed: list[int] = []

    def fresh_peers() -> list[str]:
        refreshed.append(1)
        return [str(m) for m in live.get_visible_maddrs()]

    try:
        joined = start_swarm_dht_retrying(
            gone_maddrs, {"host_maddrs": LOOPBACK}, None, fresh_peers, sleep=lambda _s: None
        )
        assert refreshed == [1]
        joined.store("probe", "seen", get_dht_time() + 30)
        found = live.get("probe", latest=True)
        assert found is not None and found.value == "seen"
    finally:
        for dht in (joined, live):
            if dht is not None:
                dht.shutdown()


@pytest.mark.timeout(120)
def test_without_fresh_peers_the_last_bootstrap_failure_is_raised() -> None:
    gone = hivemind.DHT(start=True, host_maddrs=LOOPBACK)
    gone_maddrs = [str(m) for m in gone.get_visible_maddrs()]
    gone.shutdown()
    tries: list[int] = []

    def no_fresh_peers() -> list[str]:
        tries.append(1)
        return []

    with pytest.raises(Exception, match="bootstrap"):
        start_swarm_dht_retrying(
            gone_maddrs, {"host_maddrs": LOOPBACK}, None, no_fresh_peers, sleep=lambda _s: None
        )
    assert len(tries) == 2  # three tries, fresh peers asked for between them
