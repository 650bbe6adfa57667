"""Two peers that each started alone find each other from a peer list (worker/swarm_rejoin.py).

hivemind contacts its initial peers only when a DHT starts: two real DHT peers on 127.0.0.1 that started
without any (as a worker whose bootstrap nobody answered does with ``ensure_bootstrap_success=False``)
never see each other's records. With ``keep_joined`` reading a peer list that names both, they do; and a
round on a whole swarm contacts nobody.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hivemind
import pytest
from hivemind.utils.timed_storage import get_dht_time

from tests.support.dht_reads import read_latest
from tests.support.waiting import wait_until
from worker.agent.rejoin import keep_joined, rejoin

pytestmark = [pytest.mark.swarm]
KEY = "rejoin-test_progress"


def read_list(path: Path) -> list[str]:
    """The peer list as the agent keeps it (``peers.json``), read afresh each round."""
    return list(json.loads(path.read_text())["initial_peers"])


@pytest.fixture
def alone() -> Iterator[list[hivemind.DHT]]:
    peers = [hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"]) for _ in range(2)]
    try:
        yield peers
    finally:
        for peer in peers:
            peer.shutdown()


def records(dht: hivemind.DHT) -> set[str]:
    found = read_latest(dht, KEY)
    return set(found.value) if found is not None and isinstance(found.value, dict) else set()


def publish(peers: list[hivemind.DHT]) -> None:
    for index, peer in enumerate(peers):
        peer.store(KEY, subkey=f"peer-{index}", value=index, expiration_time=get_dht_time() + 60)


async def routing_table_size(_dht: Any, node: Any) -> int:
    return len(node.protocol.routing_table.uid_to_peer_id)


@pytest.mark.timeout(120)
def test_peers_that_started_alone_join_through_the_peer_list(
    alone: list[hivemind.DHT], tmp_path: Path
) -> None:
    publish(alone)
    assert [records(peer) for peer in alone] == [{"peer-0"}, {"peer-1"}], "the peers started apart"
    listed = tmp_path / "peers.json"
    listed.write_text(
        json.dumps({"initial_peers": [str(m) for peer in alone for m in peer.get_visible_maddrs()]})
    )

    alone[0].run_coroutine(functools.partial(keep_joined, functools.partial(read_list, listed), 0.5))

    def whole() -> bool:
        publish(alone)
        return all(records(peer) == {"peer-0", "peer-1"} for peer in alone)

    wait_until(whole, 60, interval_s=1.0, message="each peer reads both records")
    assert all(peer.run_coroutine(routing_table_size) == 1 for peer in alone)


async def rejoin_round(maddrs: list[str], _dht: Any, node: Any) -> int:
    return len(await rejoin(maddrs, node))


@pytest.mark.timeout(120)
def test_a_round_in_a_whole_swarm_contacts_nobody(alone: list[hivemind.DHT]) -> None:
    first, _ = alone
    maddrs = [str(m) for peer in alone for m in peer.get_visible_maddrs()]
    assert first.run_coroutine(functools.partial(rejoin_round, maddrs)) == 1  # it met the other peer
    assert first.run_coroutine(functools.partial(rejoin_round, maddrs)) == 0  # known now: nothing to do
