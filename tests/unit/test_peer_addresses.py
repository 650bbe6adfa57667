"""The rules for peer addresses (worker/protocol/peer_addresses.py): what the orchestrator passes on from
heartbeats to new workers, and which initial peers a worker drops before starting p2pd."""

from __future__ import annotations

import hashlib
import logging

import base58
import pytest

from worker.protocol.peer_addresses import announced_addresses, peer_address, usable_initial_peers


def peer_id(seed: str) -> str:
    """A well-formed libp2p peer id (a SHA-256 multihash in base58)."""
    return base58.b58encode(bytes([0x12, 0x20]) + hashlib.sha256(seed.encode()).digest()).decode()


OWN, OTHER = peer_id("own"), peer_id("other")


def test_only_dialable_tcp_addresses_with_a_peer_id_parse() -> None:
    for good in (
        f"/ip4/10.0.0.7/tcp/4000/p2p/{OWN}",
        f"/ip6/::1/tcp/4000/p2p/{OWN}",
        f"/dns4/worker-7.internal/tcp/4000/p2p/{OWN}",
    ):
        assert peer_address(good) == (good, OWN)
    assert peer_address(f"/ip4/10.0.0.7/tcp/4000/ipfs/{OWN}") == (f"/ip4/10.0.0.7/tcp/4000/p2p/{OWN}", OWN)
    for bad in (
        "garbage",
        '/ip4/1.2.3.4/tcp/1"><img src=x>',
        f"/ip4/10.0.0.7/udp/4000/quic/p2p/{OWN}",
        f"/ip4/10.0.0.7/tcp/70000/p2p/{OWN}",
        f"/ip4/999.0.0.7/tcp/4000/p2p/{OWN}",
        "/ip4/10.0.0.7/tcp/4000",
        "/ip4/10.0.0.7/tcp/4000/p2p/QmWorker1",
        f"/ip4/10.0.0.7/tcp/4000/p2p/{OWN}/p2p-circuit",
    ):
        assert peer_address(bad) is None, bad


def test_announced_addresses_keep_the_workers_own_peer_only() -> None:
    mine = [f"/ip4/10.0.0.7/tcp/4000/p2p/{OWN}", f"/dns4/w7/tcp/4000/p2p/{OWN}"]
    reported = ["garbage", mine[0], f"/ip4/10.0.0.8/tcp/4000/p2p/{OTHER}", mine[1], mine[0]]
    assert announced_addresses(reported, OWN) == mine
    assert announced_addresses(reported, peer_id("nobody")) == []
    # no token-bound peer id (a run without swarm admission): the first dialable address's peer only
    assert announced_addresses(reported, None) == mine


def test_a_worker_drops_initial_peers_p2pd_would_refuse(caplog: pytest.LogCaptureFixture) -> None:
    keep = [f"/ip4/10.0.0.7/tcp/4000/p2p/{OWN}", f"/ip4/10.0.0.7/udp/4000/quic/p2p/{OWN}"]
    drop = ["garbage", '/ip4/1.2.3.4/tcp/1"><img src=x>', "/ip4/10.0.0.7/tcp/4000"]
    with caplog.at_level(logging.WARNING, logger="worker.protocol.peer_addresses"):
        assert usable_initial_peers([drop[0], keep[0], drop[1], keep[1], drop[2]]) == keep
    assert len(caplog.records) == len(drop)
