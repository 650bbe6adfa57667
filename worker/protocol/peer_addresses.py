"""Multiaddrs of swarm peers: which ones can serve as initial peers, and whose peer they point to.

Both sides use these rules. p2pd refuses to start when any bootstrap address does not parse, so a
worker drops such initial peers (with a warning) instead of failing (:func:`usable_initial_peers`). The
orchestrator keeps from heartbeats only dialable addresses of the worker's own peer
(:func:`peer_address`), since they become every new worker's initial peers: one malformed address would
stop every later worker, and someone else's peer would be an eclipse.

Parsing uses hivemind's copy of py-multiaddr (``hivemind.utils.multiaddr``), imported on first use: the
orchestrator's modules load without hivemind.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import NamedTuple

logger = logging.getLogger(__name__)

#: Host protocols of an address a peer on another machine can dial over TCP.
HOST_PROTOCOLS = frozenset({"ip4", "ip6", "dns", "dns4", "dns6"})
# What a dialable address looks like before it is parsed: cheap, and rejects most junk at once.
_SHAPE = re.compile(
    r"^/(ip4|ip6|dns|dns4|dns6)/[^/]{1,253}/tcp/[0-9]{1,5}/(p2p|ipfs)/[1-9A-HJ-NP-Za-km-z]{2,128}$"
)


class PeerAddress(NamedTuple):
    """A dialable address (canonical form) and the libp2p peer id it names."""

    maddr: str
    peer_id: str


@lru_cache(maxsize=4096)
def peer_address(maddr: str) -> PeerAddress | None:
    """``maddr`` if it is ``/ip4|ip6|dns*/<host>/tcp/<port>/p2p/<peer id>`` and parses, else None."""
    if not _SHAPE.match(maddr):
        return None
    from hivemind.utils.multiaddr import Multiaddr

    try:
        parsed = Multiaddr(maddr)
        parts = [(protocol.name, value) for protocol, value in parsed.items()]
    except (ValueError, LookupError, TypeError):
        return None
    names = [name for name, _ in parts]
    if len(parts) != 3 or names[0] not in HOST_PROTOCOLS or names[1:] != ["tcp", "p2p"]:
        return None
    return PeerAddress(str(parsed), str(parts[2][1]))


def announced_addresses(maddrs: Iterable[str], peer_id: str | None) -> list[str]:
    """The dialable addresses among ``maddrs`` of peer ``peer_id``; with ``peer_id`` None (a swarm
    without admission: no token names the worker's peer), those of the first dialable address's peer."""
    kept: list[str] = []
    for maddr in maddrs:
        if peer_id is not None and not maddr.endswith("/" + peer_id):
            continue  # someone else's peer (or junk): not even worth parsing
        parsed = peer_address(maddr)
        if parsed is None or (peer_id is not None and parsed.peer_id != peer_id):
            continue
        peer_id = parsed.peer_id
        if parsed.maddr not in kept:
            kept.append(parsed.maddr)
    return kept


def _bootstrap_problem(maddr: str) -> str | None:
    """Why p2pd could not bootstrap from ``maddr``, or None when it can."""
    from hivemind.utils.multiaddr import Multiaddr

    try:
        protocols = [protocol.name for protocol, _ in Multiaddr(maddr).items()]
    except (ValueError, LookupError, TypeError) as exc:
        return str(exc)
    return None if protocols and protocols[-1] == "p2p" else "no /p2p/<peer id> at its end"


def usable_initial_peers(initial_peers: Sequence[str]) -> list[str]:
    """``initial_peers`` without those p2pd would refuse (each dropped one is logged as a warning).

    Lenient on purpose: any address that parses and ends in a peer id is kept (QUIC, relays...), only
    what would stop the DHT from starting at all is dropped.
    """
    usable = []
    for maddr in initial_peers:
        problem = _bootstrap_problem(maddr)
        if problem is None:
            usable.append(maddr)
        else:
            logger.warning("dropping unusable initial peer %r: %s", maddr, problem)
    return usable
