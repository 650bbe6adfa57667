"""A DHT peer with no process and no records, for the orchestrator in-process (``inprocess.py``).

It keeps the contract of :class:`orchestrator.swarm.dht.DHTPeer` the way a peer alone in its network
would: it is up until shut down, has no address to offer (the API's peer lists then hold only the announce
addresses the settings name), and every swarm it is asked about has no progress record, so routes that
read a run's swarm get empty progress. Nothing runs in a process it does not have: a coroutine handed
to it (the opted-out runs under swarm admission) is dropped, since no peer knocks on it. After
``shutdown`` every call raises :class:`DHTUnavailable`, as the real peer's do once it is gone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from orchestrator.clock import Clock
from orchestrator.config import Settings
from orchestrator.progress import SwarmProgress
from orchestrator.swarm.admission import SwarmAuthority
from orchestrator.swarm.dht import DHTUnavailable


class NullDHT:
    """A DHT peer alone in its network: up, addressless, knowing no swarm's progress."""

    def __init__(self) -> None:
        self._running = True

    @property
    def visible_maddrs(self) -> list[str]:
        return []

    def alive(self) -> bool:
        return self._running

    def read_progress(
        self, swarms: Mapping[str, int], timeout_s: float, now: Clock
    ) -> dict[str, SwarmProgress | None]:
        self._check()
        return dict.fromkeys(swarms)

    def run_coroutine(
        self, coro: Callable[[Any, Any], Awaitable[Any]], timeout_s: float | None = None
    ) -> Any:
        self._check()
        return None

    def shutdown(self) -> None:
        self._running = False

    def _check(self) -> None:
        if not self._running:
            raise DHTUnavailable("the DHT peer is not running")


def null_dht(settings: Settings, authority: SwarmAuthority | None, open_swarms: frozenset[str]) -> NullDHT:
    """``create_app``'s ``dht_factory`` for a peer with no process (the arguments shape only a real one)."""
    return NullDHT()
