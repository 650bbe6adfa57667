"""Run progress as the orchestrator's parts pass it along: the DHT's view of a swarm and the points a
run's progress samples are forwarded as.

A leaf (it imports nothing of the server), so the parts that write progress (the DHT reader in
``swarm/``, the heartbeat flusher in ``heartbeats/``), the rules that read it (``domain/``) and the
forwarder that exports it (``metrics/tensorboard.py``) share its types without importing each other.

- :class:`SwarmProgress` and :class:`SwarmProgressCache`: each swarm's progress as last read from the
  DHT (``swarm/dht.py`` reads it, routes and the flusher read the cache).
- :class:`RunPoint` and :class:`Forwarder`: one progress sample of a run, and where samples go besides
  the database (``metrics/tensorboard.py``: TensorBoard).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Protocol


@dataclass(frozen=True)
class SwarmProgress:
    """A run's swarm as the DHT shows it, computed like ``ProgressTracker`` does."""

    epoch: int
    samples_accumulated: int
    num_peers: int
    num_clients: int
    samples_per_s: float
    target_batch_size: int
    read_at: datetime


class SwarmProgressCache:
    """The latest swarm progress per swarm id; written by the refresher, read by routes (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, SwarmProgress] = {}

    def get(self, swarm_id: str) -> SwarmProgress | None:
        with self._lock:
            return self._items.get(swarm_id)

    def update(self, swarm_id: str, progress: SwarmProgress | None, read_at: datetime) -> None:
        """Store a read; an empty read keeps the last epoch but shows no peers and no throughput."""
        with self._lock:
            if progress is not None:
                self._items[swarm_id] = progress
            elif swarm_id in self._items:
                old = self._items[swarm_id]
                self._items[swarm_id] = replace(
                    old, samples_accumulated=0, num_peers=0, num_clients=0, samples_per_s=0.0, read_at=read_at
                )

    def forget(self, swarm_id: str) -> None:
        """Drop what was read of one swarm (a resumed run counts its epochs from its checkpoint)."""
        with self._lock:
            self._items.pop(swarm_id, None)

    def forget_except(self, swarm_ids: set[str]) -> None:
        with self._lock:
            for key in set(self._items) - swarm_ids:
                del self._items[key]


@dataclass(frozen=True)
class RunPoint:
    """One progress sample of a run, as forwarded."""

    run: str
    at: datetime
    epoch: int
    figures: dict[str, float]  # swarm figures (tagged ``spotswarm/<name>``)
    metrics: dict[str, float] = field(default_factory=dict)  # reported metrics (tagged by their names)


class Forwarder(Protocol):
    """Where progress samples go besides the database."""

    def write(self, points: list[RunPoint]) -> None: ...

    def close(self) -> None: ...
