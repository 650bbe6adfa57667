"""Fixtures of the integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import hivemind
import pytest

from worker.strategy.dht import start_dht


@pytest.fixture
def lone_dht() -> Iterator[hivemind.DHT]:
    """A worker's DHT peer (``start_dht``) on 127.0.0.1 with no other peer, for one test."""
    peer = start_dht(initial_peers=[], host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    try:
        yield peer
    finally:
        peer.shutdown()
