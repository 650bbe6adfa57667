"""What a peer can tell about its swarm: the ``SwarmProgress`` snapshot and the swarm-wide sample rate.

Everything here reads what hivemind's ``ProgressTracker`` already publishes: each peer stores its
progress (epoch, samples accumulated, samples/s) under ``<run_id>_progress`` in the DHT, and the
tracker of every optimizer folds those records into ``tracker.global_progress``. The one number the
tracker computes but does not keep is the swarm's sample rate, so ``SwarmRateReader`` reads the same
records, in the background, at most every few seconds.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import hivemind
from lightning.pytorch import LightningModule

log = logging.getLogger(__name__)
_READ_FAILURES = (concurrent.futures.CancelledError, concurrent.futures.TimeoutError, OSError, RuntimeError)

#: Names under which ``HivemindStrategy`` logs swarm metrics through Lightning (progress bar, loggers).
METRIC_PEERS = "swarm/peers"
METRIC_EPOCH = "swarm/epoch"
METRIC_SAMPLES_PER_S = "swarm/samples_per_s"
METRIC_LOCAL_SAMPLES = "swarm/local_samples"


@dataclass(frozen=True)
class SwarmProgress:
    """A snapshot of the swarm as this peer sees it.

    ``epoch`` is the swarm's global step (hivemind epoch: one per ``target_batch_size`` samples
    accumulated by all peers together); ``num_peers`` counts every peer reporting progress, this one
    included; ``samples_accumulated`` is the swarm's progress towards the next epoch.
    """

    epoch: int
    num_peers: int
    samples_accumulated: int
    target_batch_size: int
    samples_per_second: float


def progress_from_tracker(tracker: Any, samples_per_second: float) -> SwarmProgress:
    """Build a ``SwarmProgress`` from a hivemind ``ProgressTracker`` (its ``global_progress``).

    The swarm's epoch is at least this peer's own: hivemind's optimizer sets an epoch it downloaded with
    ``report_local_progress``, which leaves ``global_progress`` at its last fetch (up to seconds behind);
    until the next fetch, the samples known of that epoch are this peer's own.
    """
    progress = tracker.global_progress  # replaced, never half-written, by the tracker's thread
    local = tracker.local_progress
    epoch, samples = progress.epoch, progress.samples_accumulated
    if local.epoch > epoch:
        epoch, samples = local.epoch, local.samples_accumulated
    return SwarmProgress(
        epoch=int(epoch),
        num_peers=int(progress.num_peers),
        samples_accumulated=int(samples),
        target_batch_size=int(progress.target_batch_size),
        samples_per_second=float(samples_per_second),
    )


def total_samples_per_second(record: object) -> float:
    """Sum the ``samples_per_second`` of every live peer in a ``<run_id>_progress`` DHT record.

    ``record`` is what ``dht.get(key, latest=True)`` returns: ``None`` or a value whose ``.value`` maps
    each peer's subkey to a value holding that peer's progress dict (``None`` once it said goodbye).
    """
    peers = getattr(record, "value", None)
    if not isinstance(peers, Mapping):
        return 0.0
    total = 0.0
    for entry in peers.values():
        progress = getattr(entry, "value", None)
        if isinstance(progress, Mapping):
            rate = progress.get("samples_per_second")
            if isinstance(rate, (int, float)) and rate >= 0:
                total += float(rate)
    return total


class SwarmRateReader:
    """The swarm's samples/s, refreshed from the DHT in the background; never blocks the caller.

    Each call returns the last value read and, when ``refresh_s`` has passed, starts a new read.
    A read that fails keeps the previous value (and is logged at debug level).
    """

    def __init__(
        self,
        dht: hivemind.DHT,
        run_id: str,
        refresh_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._dht = dht
        self._key = f"{run_id}_progress"
        self._refresh_s = refresh_s
        self._clock = clock
        self._pending: concurrent.futures.Future[Any] | None = None
        self._next_read_at = clock()
        self._value = 0.0

    def samples_per_second(self) -> float:
        """The latest known swarm-wide rate (0.0 until the first read completes)."""
        if self._pending is not None and self._pending.done():
            self._collect(self._pending)
            self._pending = None
        now = self._clock()
        if self._pending is None and now >= self._next_read_at:
            self._next_read_at = now + self._refresh_s
            self._pending = self._dht.get(self._key, latest=True, return_future=True)
        return self._value

    def _collect(self, future: concurrent.futures.Future[Any]) -> None:
        try:
            self._value = total_samples_per_second(future.result(timeout=0))
        except _READ_FAILURES as exc:
            log.debug("reading %s from the DHT failed: %r", self._key, exc)

    def close(self) -> None:
        """Forget any read still in flight (the DHT may be shutting down)."""
        if self._pending is not None and not self._pending.done():
            self._pending.cancel()
        self._pending = None


class MetricsThrottle:
    """Decides when swarm metrics are worth logging: when the swarm changed, else every ``every_s``.

    Lightning's ``log_dict`` costs about as much as hivemind's whole step for a small model, and the
    swarm's numbers change once per swarm epoch, not per local step.
    """

    def __init__(self, every_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._every_s, self._clock = every_s, clock
        self._last_state: object = None
        self._next_at = float("-inf")

    def due(self, state: object) -> bool:
        """True (and the timer restarts) if ``state`` differs from the last logged one or time is up."""
        now = self._clock()
        if state == self._last_state and now < self._next_at:
            return False
        self._last_state, self._next_at = state, now + self._every_s
        return True


def log_swarm_metrics(module: LightningModule, progress: SwarmProgress, local_samples: int) -> None:
    """Log the swarm's state through Lightning (progress bar, loggers and ``callback_metrics``)."""
    metrics = {
        METRIC_PEERS: float(progress.num_peers),
        METRIC_EPOCH: float(progress.epoch),
        METRIC_SAMPLES_PER_S: progress.samples_per_second,
        METRIC_LOCAL_SAMPLES: float(local_samples),
    }
    module.log_dict(metrics, prog_bar=True, on_step=True, on_epoch=False, batch_size=1)
