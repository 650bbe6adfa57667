"""Keeping a worker's DHT peer joined to its run's peers: hivemind bootstraps once, and never again.

``DHTNode`` contacts its initial peers only when it starts (hivemind 1.1.12, ``DHTNode.create``); after
that it knows the peers in its routing table and the ones they name. A peer that started alone (a
bootstrap nobody answered, with ``ensure_bootstrap_success=False``), or whose routing table lost the
peers it joined through (requests that failed or timed out remove a peer), stays alone for good even
though its peers are reachable: its progress tracker counts one peer, it skips every averaging round,
and, since the orchestrator's DHT peer stores nothing, no record of the others ever reaches it. Kademlia
implementations that face this bootstrap again from known peers when their table runs empty
(go-libp2p-kad-dht issue 387); hivemind has no such step.

:func:`keep_joined`, run in the DHT's process, does it from the run's peer list (the orchestrator's peer
and the freshest workers, kept in the worker directory by the agent's heartbeat thread): every
``interval_s`` it pings each listed peer that is missing from the routing table. One that answers goes
into the table (and off hivemind's blacklist of peers that failed to answer), then the node looks up its
own neighbours through it, as it did at its start. In a whole swarm every listed live peer is in the
table already and a round does nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from hivemind.p2p import P2PDaemonError, PeerID
from hivemind.utils.multiaddr import Multiaddr

from worker.protocol.peer_addresses import peer_address

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0
_loops: set[asyncio.Task[None]] = set()  # strong references: asyncio keeps only weak ones


def listed_peers(maddrs: Sequence[str], own: PeerID) -> dict[PeerID, list[Multiaddr]]:
    """The peers ``maddrs`` name (dialable addresses only), each with its addresses, ``own`` left out."""
    peers: dict[PeerID, list[Multiaddr]] = {}
    for maddr in maddrs:
        parsed = peer_address(maddr)
        if parsed is None:
            continue
        peer = PeerID.from_base58(parsed.peer_id)
        if peer != own:
            host = Multiaddr(parsed.maddr).decapsulate(Multiaddr(f"/p2p/{parsed.peer_id}"))
            peers.setdefault(peer, []).append(host)
    return peers


async def rejoin(maddrs: Sequence[str], node: Any) -> list[PeerID]:
    """Ping the peers of ``maddrs`` missing from ``node``'s routing table; returns those that answered
    (now in the table). ``node`` is the ``DHTNode`` of the DHT's process."""
    missing = {
        peer: addrs
        for peer, addrs in listed_peers(maddrs, node.peer_id).items()
        if peer not in node.protocol.routing_table
    }
    answers = await asyncio.gather(*(_ping(node, peer, addrs) for peer, addrs in missing.items()))
    answered = [peer for peer, ok in zip(missing, answers, strict=True) if ok]
    if answered:
        logger.info(
            "rejoined the swarm through %d listed peer(s) missing from the routing table", len(answered)
        )
        await node.find_nearest_nodes([node.node_id])  # as DHTNode.create does after its pings
    return answered


async def _ping(node: Any, peer: PeerID, addrs: list[Multiaddr]) -> bool:
    try:  # tell the libp2p daemon where the peer is: a worker it never met has no known address
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            await node.p2p._client.connect(peer, addrs)
    except (TimeoutError, P2PDaemonError, OSError) as exc:
        logger.debug("could not reach listed peer %s: %r", peer, exc)
        return False
    if await node.protocol.call_ping(peer) is None:
        return False
    node.blacklist.register_success(peer)
    return True


async def keep_joined(peers: Callable[[], list[str]], interval_s: float, _dht: Any, node: Any) -> None:
    """``dht.run_coroutine(partial(keep_joined, peers, interval_s))``: start, in the DHT's process, a
    task that calls :func:`rejoin` with ``peers()`` every ``interval_s`` until the DHT shuts down.
    ``peers`` must be picklable (a ``functools.partial`` of a module-level function)."""
    task = asyncio.create_task(_rejoin_forever(peers, interval_s, node))
    _loops.add(task)
    task.add_done_callback(_loops.discard)


async def _rejoin_forever(peers: Callable[[], list[str]], interval_s: float, node: Any) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await rejoin(peers(), node)
        except Exception:  # logged with traceback; one bad round must not end the loop
            logger.exception("rejoining the swarm's listed peers failed; trying again in %.0f s", interval_s)
