"""When a swarm epoch ends: hivemind's progress tracker, judging the swarm's samples at every step.

hivemind 1.1.12's ``ProgressTracker`` ends an epoch when another peer is already in a later epoch, when
its count of the swarm's samples reaches ``target_batch_size``, or when the ETA it computed at its last
read of the peers' progress records has passed. Its count is the sum it read at that last fetch plus this
peer's own samples since: what the other peers accumulated since the fetch is missing. Fetches come every
0.5 to 10 s, later on a busy machine (the tracker's thread waits for the GIL and the DHT process), and each
one replaces the count with the DHT's sum, in which this peer's own record lags too. So whenever a swarm
epoch lasts a few seconds or less, a peer often sees only itself and contributes up to
``target_batch_size`` on its own: the swarm's batch grows towards N x ``target_batch_size`` with N peers,
which changes the optimisation a user chose (``bench/swarm_batch.py`` measures it).

:class:`SwarmBatchTracker` keeps hivemind's fetching and reporting and changes the judgement: at every step
it estimates the swarm's samples as this peer's exact count plus, for each other peer of its last fetch,
the samples that peer reported plus its rate times the time since (the extrapolation hivemind's ETA uses,
done now instead of at the fetch). The epoch ends once the estimate reaches ``target_batch_size``, and the
ETA that pre-schedules averaging rounds comes from the same estimate, so peers start their round together.
A peer whose record is still in the previous epoch most often left the same averaging round as this one
and has not reported its new epoch yet (the fetch that follows a round comes before the others' reports):
until a fetch at least ``min_refresh_period`` into this epoch shows where it is, it counts from this
epoch's start at its last rate while training. A later fetch that still shows it in the previous epoch
means it is not training with this peer (stuck in its round, or downloading state), and it counts 0.

A DHT read now and then misses a record that is there (records live on the peers nearest their key,
and a read may ask one that has not got it yet): hivemind then counts one peer fewer, and a peer that
reads itself alone applies its own gradients, skipping the round its partner waits in. A record that
was in the last fetch, absent (not withdrawn: a leaving peer stores an empty record) from this one, and
fresh is carried over for that one fetch (:func:`carry_missed_records`).

Two rules keep the extrapolation honest:

- a peer that stops accumulating (its epoch ended and it waits in the averaging round, or it downloads
  state) reports a rate of 0 with its final count, so the others stop counting samples it never computes;
- a record older than ``stale_after_s`` when it was fetched (a peer that died or hangs: live peers report
  several times a second) counts its reported samples only.

It also reports this peer's progress to the DHT at most every ``report_interval_s`` while it accumulates
(at once when its epoch changes or it stops accumulating), where hivemind stores a record at every local
step: with steps of a few milliseconds that is hundreds of DHT stores a second per peer, paid for by the
training process (the store is sent from the tracker's thread) and by every peer that holds the key. The
others extrapolate between reports with the rate each report carries.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from hivemind.optim.progress_tracker import (
    GlobalTrainingProgress,
    LocalTrainingProgress,
    ProgressTracker,
)
from hivemind.utils import get_dht_time

#: a record this old when fetched comes from a peer that stopped reporting (live ones report often)
DEFAULT_STALE_AFTER_S = 10.0
#: at most this long between two progress records of a peer that accumulates
DEFAULT_REPORT_INTERVAL_S = 0.2
#: how long a peer's progress record outlives its last write (hivemind: 60 s). A live peer rewrites it
#: at least every half of this (a store of a few hundred bytes), so it is never older than
#: ``DEFAULT_STALE_AFTER_S`` while the peer lives; a peer killed without leaving is forgotten this long
#: after its last write, and until then its epoch and samples count: a dead peer ahead of the others
#: makes each of them download state at every step, from peers no further than itself, until it expires
METADATA_EXPIRATION_S = 10.0
#: how often a peer that sees no other looks again (hivemind: 3 s, during which a new swarm's first peers
#: each train alone, every epoch applied locally)
DEFAULT_ALONE_REFRESH_S = 1.0


@dataclass(frozen=True)
class PeerRecord:
    """Another peer's last report: its epoch, its samples towards it, when; ``rate`` is the rate it
    reported (0 while it does not accumulate), ``training_rate`` its last non-zero one; both are 0 for a
    stale record."""

    epoch: int
    samples: int
    time: float
    rate: float
    training_rate: float


@dataclass(frozen=True)
class OthersEstimate:
    """The other peers' samples towards one epoch, as a function of time: ``base + rate * now``."""

    base: float = 0.0
    rate: float = 0.0

    def at(self, now: float) -> float:
        return max(0.0, self.base + self.rate * now)


def estimate_others(
    records: Iterable[PeerRecord], epoch: int, epoch_started_at: float, count_previous: bool
) -> OthersEstimate:
    """Fold the other peers' records into a linear estimate of their samples towards ``epoch``.

    A peer in ``epoch`` counts its samples plus its rate times the time since its report. With
    ``count_previous`` (the records predate this epoch's first useful fetch), a peer in the previous epoch
    counts its training rate times the time since this epoch began here (or since its report, if later).
    Other records count nothing (behind: not training this epoch; ahead: the caller ends the epoch anyway).
    """
    base = rate = 0.0
    for record in records:
        if record.epoch == epoch:
            base += record.samples - record.rate * record.time
            rate += record.rate
        elif record.epoch == epoch - 1 and count_previous:
            base -= record.training_rate * max(epoch_started_at, record.time)
            rate += record.training_rate
    return OthersEstimate(base, rate)


def peer_records(
    entries: Iterable[LocalTrainingProgress],
    own_peer_id: bytes,
    fetched_at: float,
    training_rates: dict[bytes, float],
    stale_after_s: float = DEFAULT_STALE_AFTER_S,
) -> tuple[list[PeerRecord], dict[bytes, float]]:
    """The other peers' records from one fetch, and each one's last rate while training (for the next
    fetch: ``training_rates`` holds those of the last one). A stale record has rates 0."""
    records, rates = [], {}
    for progress in entries:
        if progress.peer_id == own_peer_id:
            continue
        training_rate = progress.samples_per_second or training_rates.get(progress.peer_id, 0.0)
        rates[progress.peer_id] = training_rate
        stale = fetched_at - progress.time > stale_after_s
        records.append(
            PeerRecord(
                progress.epoch,
                progress.samples_accumulated,
                progress.time,
                0.0 if stale else progress.samples_per_second,
                0.0 if stale else training_rate,
            )
        )
    return records, rates


def carry_missed_records(
    previous: dict[Any, Any],
    fetched: Any,
    carried_before: frozenset[Any],
    now: float,
    stale_after_s: float = DEFAULT_STALE_AFTER_S,
) -> tuple[Any, frozenset[Any]]:
    """The progress records of a fetch, with those of ``previous`` (the last fetch, as returned here) that
    it missed: absent from ``fetched`` (an empty value is a withdrawn record, not a missed one), reported
    within ``stale_after_s``, and not carried by the fetch before (``carried_before``), so a record is
    carried for one fetch at most. Returns the records (``fetched`` itself when nothing is carried) and
    the keys carried."""
    records = dict(fetched) if isinstance(fetched, dict) else {}
    carried = {
        subkey: entry
        for subkey, entry in previous.items()
        if subkey not in records
        and subkey not in carried_before
        and isinstance(entry.value, dict)
        and now - float(entry.value.get("time", float("-inf"))) <= stale_after_s
    }
    if not carried:
        return fetched, frozenset()
    return {**records, **carried}, frozenset(carried)


class SwarmBatchTracker(ProgressTracker):
    """hivemind's ``ProgressTracker``, ending epochs on the swarm's samples estimated at every step (module
    docstring). Takes ``ProgressTracker``'s arguments plus ``stale_after_s`` and ``report_interval_s``."""

    local_progress: LocalTrainingProgress  # hivemind's, annotated
    global_progress: GlobalTrainingProgress  # hivemind's, annotated

    def __init__(
        self,
        *args: Any,
        stale_after_s: float = DEFAULT_STALE_AFTER_S,
        report_interval_s: float = DEFAULT_REPORT_INTERVAL_S,
        **kwargs: Any,
    ) -> None:
        self.stale_after_s = stale_after_s
        self.report_interval_s = report_interval_s
        self._next_report_at = float("-inf")
        self._others: tuple[PeerRecord, ...] = ()
        self._training_rates: dict[bytes, float] = {}
        self._fetched_at = float("-inf")
        self._last_fetch: dict[Any, Any] = {}
        self._carried: frozenset[Any] = frozenset()
        self._epoch_started_at = get_dht_time()
        self._estimate: tuple[tuple[PeerRecord, ...], tuple[int, float, bool], OthersEstimate] | None = None
        self._accumulating = True
        self._counting_alone = False
        kwargs.setdefault("default_refresh_period", DEFAULT_ALONE_REFRESH_S)
        kwargs.setdefault("metadata_expiration", METADATA_EXPIRATION_S)
        super().__init__(*args, **kwargs)

    # hivemind.Optimizer decides with these two properties only
    @property
    def ready_to_update_epoch(self) -> bool:
        if self.global_progress.epoch > self.local_progress.epoch:
            return True
        return self.estimated_samples() >= self.target_batch_size

    @property
    def estimated_next_update_time(self) -> float:
        now = get_dht_time()
        if self.global_progress.epoch > self.local_progress.epoch:
            return now
        return now + self._seconds_left(now)

    def _seconds_left(self, now: float) -> float:
        """Seconds until the estimate reaches ``target_batch_size`` at the swarm's current rate."""
        missing = self.target_batch_size - self.estimated_samples(now)
        if missing <= 0:
            return 0.0
        rate = self.performance_ema.samples_per_second + self._others_estimate().rate
        return missing / max(rate, self.performance_ema.eps)

    def estimated_samples(self, now: float | None = None) -> float:
        """The swarm's samples towards this peer's epoch now: its exact count plus the others' estimate."""
        now = get_dht_time() if now is None else now
        return self.local_progress.samples_accumulated + self._others_estimate().at(now)

    def _others_estimate(self) -> OthersEstimate:
        others, epoch, started = self._others, self.local_progress.epoch, self._epoch_started_at
        # records from a fetch this early in the epoch may still show peers of the same round behind
        count_previous = self._fetched_at < started + self.min_refresh_period
        key = (epoch, started, count_previous)
        cached = self._estimate  # reused until a fetch or an epoch change: most steps see neither
        if cached is not None and cached[0] is others and cached[1] == key:
            return cached[2]
        estimate = estimate_others(others, epoch, started, count_previous)
        self._estimate = (others, key, estimate)
        return estimate

    @contextlib.contextmanager
    def pause_updates(self) -> Iterator[None]:
        """hivemind holds this while an epoch ends (averaging) or state downloads: no samples accumulate,
        so this peer reports a rate of 0 until its next epoch begins."""
        with super().pause_updates():
            self._accumulating = False
            local = self.local_progress
            self.report_local_progress(local.epoch, local.samples_accumulated, update_global_samples=False)
            try:
                yield
            finally:
                self._accumulating = True

    def update_epoch(self, new_epoch: int | None = None) -> int:
        self._accumulating = True  # the next epoch's samples start now: report the training rate again
        epoch = super().update_epoch(new_epoch)
        # read the others' records of the new epoch soon (they report it as they leave the same round);
        # only ever earlier: epochs shorter than that would otherwise put the next fetch off for good
        soon = get_dht_time() + self.min_refresh_period
        if soon < self.global_progress.next_fetch_time:
            self.global_progress.next_fetch_time = soon
            self.global_state_updated.set()  # the fetcher wakes and waits until then instead
        return epoch

    def report_local_progress(
        self, local_epoch: int, samples_accumulated: int, update_global_samples: bool = True
    ) -> None:
        """hivemind 1.1.12's ``report_local_progress``, storing the record at most every ``report_interval_s``
        while samples accumulate (at once on an epoch change, a reset, or when accumulation stops)."""
        previous = self.local_progress
        if local_epoch != previous.epoch:
            self._epoch_started_at = get_dht_time()
        extra_samples = samples_accumulated - previous.samples_accumulated
        if update_global_samples and local_epoch == previous.epoch == self.global_progress.epoch:
            self.global_progress.samples_accumulated += extra_samples
        if extra_samples > 0:
            self.performance_ema.update(task_size=extra_samples)
        else:
            self.performance_ema.reset_timer()
        self.local_progress = self._get_local_progress(local_epoch, samples_accumulated)
        now = time.monotonic()
        routine = extra_samples > 0 and local_epoch == previous.epoch and self._accumulating
        if not routine or now >= self._next_report_at:
            self._next_report_at = now + self.report_interval_s
            self.should_report_progress.set()

    def _get_local_progress(self, local_epoch: int, samples_accumulated: int) -> LocalTrainingProgress:
        progress = super()._get_local_progress(local_epoch, samples_accumulated)
        if not self._accumulating:
            progress.samples_per_second = 0.0
        return progress

    def count_alone(self) -> None:
        """From now on the swarm counts as this peer alone: hivemind then starts no averaging round and
        applies this peer's own gradients. For a peer that leaves, whose peers may be gone already."""
        self._counting_alone = True
        # not under hivemind's lock: a peer holds it for the whole of each averaging round, and a fetch
        # that assigns after this one parses with the flag above
        self.global_progress = replace(self.global_progress, num_peers=1)

    def _parse_swarm_progress_data(self, metadata: Any) -> GlobalTrainingProgress:
        now = get_dht_time()
        metadata, self._carried = carry_missed_records(
            self._last_fetch, metadata, self._carried, now, self.stale_after_s
        )
        self._last_fetch = dict(metadata) if isinstance(metadata, dict) else {}
        entries = []
        if isinstance(metadata, dict):
            entries = [
                LocalTrainingProgress.parse_obj(entry.value) for entry in metadata.values() if entry.value
            ]
        records, self._training_rates = peer_records(
            entries, self.dht.peer_id.to_bytes(), now, self._training_rates, self.stale_after_s
        )
        self._others, self._fetched_at = tuple(records), now
        progress = super()._parse_swarm_progress_data(metadata)
        if entries:
            # hivemind times the next fetch from its own ETA, which is unbounded while the peers it read
            # wait in a round (rate 0): half the time left by this estimate, within hivemind's bounds
            progress.next_fetch_time = now + min(
                max(self._seconds_left(now) / 2, self.min_refresh_period), self.max_refresh_period
            )
        if self._counting_alone:
            progress.num_peers = 1
        return progress
