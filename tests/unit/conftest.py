"""Fixtures of the unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import hivemind
import pytest

from orchestrator.db.session import Database
from worker.strategy.dht import start_dht


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    """A fresh SQLite database, migrated to the latest schema, for one test."""
    database = Database(f"sqlite:///{tmp_path / 'unit.db'}")
    database.upgrade()
    try:
        yield database
    finally:
        database.close()


@pytest.fixture
def lone_dht() -> Iterator[hivemind.DHT]:
    """A worker's DHT peer (``start_dht``) on 127.0.0.1 with no other peer, for one test."""
    peer = start_dht(initial_peers=[], host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    try:
        yield peer
    finally:
        peer.shutdown()
