"""When a swarm epoch ends (worker/strategy/tracker.py): the swarm's samples estimated at every step.

The pure rules first, then real trackers on two DHT peers on 127.0.0.1: one sees the other's samples
between fetches, a peer that stops accumulating tells the others so, and an epoch reached by download
is the swarm's epoch as the strategy reports it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import hivemind
import pytest
from hivemind.optim.progress_tracker import LocalTrainingProgress, ProgressTracker
from hivemind.utils import ValueWithExpiration, get_dht_time
from hivemind.utils.crypto import RSAPrivateKey

from tests.support.waiting import wait_until
from worker.strategy.metrics import progress_from_tracker
from worker.strategy.tracker import (
    OthersEstimate,
    PeerRecord,
    SwarmBatchTracker,
    carry_missed_records,
    estimate_others,
    peer_records,
)

pytestmark = pytest.mark.timeout(120)


def test_a_peer_in_this_epoch_counts_its_samples_plus_its_rate_since_its_report() -> None:
    records = [PeerRecord(epoch=7, samples=100, time=1000.0, rate=50.0, training_rate=50.0)]
    estimate = estimate_others(records, epoch=7, epoch_started_at=990.0, count_previous=False)
    assert estimate.at(1000.0) == pytest.approx(100.0)
    assert estimate.at(1002.0) == pytest.approx(200.0)


def test_a_peer_still_in_the_previous_epoch_counts_from_this_epochs_start_until_a_later_fetch() -> None:
    # it entered its round (rate 0) at 995, this peer left the round at 1000: they left it together
    waiting = [PeerRecord(epoch=6, samples=900, time=995.0, rate=0.0, training_rate=40.0)]
    early = estimate_others(waiting, epoch=7, epoch_started_at=1000.0, count_previous=True)
    assert early.at(1001.0) == pytest.approx(40.0)  # its training rate since this epoch began
    # a fetch well into the epoch still shows it behind: stuck in its round or downloading, not training
    assert estimate_others(waiting, 7, 1000.0, count_previous=False) == OthersEstimate(0.0, 0.0)


def test_peers_further_behind_or_ahead_count_nothing() -> None:
    records = [
        PeerRecord(epoch=5, samples=900, time=1000.0, rate=50.0, training_rate=50.0),  # downloading state
        PeerRecord(epoch=8, samples=10, time=1000.0, rate=50.0, training_rate=50.0),  # ahead: epoch ends
    ]
    assert estimate_others(records, 7, 1000.0, count_previous=True) == OthersEstimate(0.0, 0.0)


def test_a_peer_that_stopped_accumulating_counts_its_samples_only() -> None:
    waiting = PeerRecord(epoch=7, samples=300, time=1000.0, rate=0.0, training_rate=50.0)
    assert estimate_others([waiting], 7, 990.0, count_previous=True).at(1060.0) == pytest.approx(300.0)


def test_estimates_of_several_peers_add_up() -> None:
    records = [PeerRecord(7, 100, 1000.0, 50.0, 50.0), PeerRecord(7, 40, 1001.0, 20.0, 20.0)]
    assert estimate_others(records, 7, 990.0, count_previous=False).at(1003.0) == pytest.approx(330.0)


def _progress(peer: bytes, epoch: int, samples: int, rate: float, time: float) -> LocalTrainingProgress:
    return LocalTrainingProgress(
        peer_id=peer, epoch=epoch, samples_accumulated=samples, samples_per_second=rate, time=time,
        client_mode=False,
    )  # fmt: skip


def test_records_leave_out_this_peer_remember_training_rates_and_stop_extrapolating_stale_ones() -> None:
    entries = [
        _progress(b"me", 3, 10, 99.0, 1000.0),
        _progress(b"fresh", 3, 20, 40.0, 995.0),
        _progress(b"waiting", 3, 25, 0.0, 998.0),  # in its round: rate 0, trained at 30 before
        _progress(b"silent", 3, 30, 40.0, 980.0),  # no report for 20 s: dead or hung
    ]
    records, rates = peer_records(entries, b"me", 1000.0, {b"waiting": 30.0}, stale_after_s=10.0)
    assert records == [
        PeerRecord(3, 20, 995.0, 40.0, 40.0),
        PeerRecord(3, 25, 998.0, 0.0, 30.0),
        PeerRecord(3, 30, 980.0, 0.0, 0.0),
    ]
    assert rates == {b"fresh": 40.0, b"waiting": 30.0, b"silent": 40.0}


def _record(time: float | None) -> ValueWithExpiration[object]:
    """A progress record as a DHT read returns it (``None``: a withdrawn record)."""
    return ValueWithExpiration(None if time is None else {"epoch": 3, "time": time}, (time or 0.0) + 60)


def test_a_fresh_record_one_read_missed_is_carried_for_that_read_only() -> None:
    last = {b"me": _record(999.0), b"other": _record(998.0)}
    fetched = {b"me": _record(1000.0)}  # the read missed the other peer's record
    records, carried = carry_missed_records(last, fetched, frozenset(), 1000.0, stale_after_s=10.0)
    assert records == {b"me": _record(1000.0), b"other": _record(998.0)}
    assert carried == {b"other"}
    # missed again by the next read: now it counts as gone
    again, carried = carry_missed_records(
        records, {b"me": _record(1001.0)}, carried, 1001.0, stale_after_s=10.0
    )
    assert again == {b"me": _record(1001.0)}
    assert carried == frozenset()


def test_a_withdrawn_a_stale_or_an_unmissed_record_is_not_carried() -> None:
    last = {b"left": _record(999.0), b"silent": _record(980.0), b"here": _record(999.0)}
    fetched = {b"left": _record(None), b"here": _record(1000.0)}  # "left" withdrew its record
    records, carried = carry_missed_records(last, fetched, frozenset(), 1000.0, stale_after_s=10.0)
    assert records is fetched
    assert carried == frozenset()


def test_a_read_that_found_nothing_keeps_the_fresh_records_of_the_last_one() -> None:
    last = {b"me": _record(999.0), b"other": _record(999.5)}
    records, carried = carry_missed_records(last, None, frozenset(), 1000.0, stale_after_s=10.0)
    assert records == last
    assert carried == {b"me", b"other"}


# ------------------------------------------------------------------------- two real trackers
@pytest.fixture
def two_dhts() -> Iterator[tuple[hivemind.DHT, hivemind.DHT]]:
    first = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    second = hivemind.DHT(
        initial_peers=[str(a) for a in first.get_visible_maddrs()], host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        start=True,
    )  # fmt: skip
    yield first, second
    second.shutdown()
    first.shutdown()


#: makes a tracker on DHT peer 0 or 1 of ``two_dhts``: ``tracker_of(peer, target, max_refresh_period=0.5)``
TrackerOf = Callable[..., SwarmBatchTracker]


@pytest.fixture
def tracker_of(two_dhts: tuple[hivemind.DHT, hivemind.DHT]) -> Iterator[TrackerOf]:
    """Trackers on the two DHT peers, each shut down when the test ends (before the peers)."""
    made: list[SwarmBatchTracker] = []

    def make(peer: int, target: int, max_refresh_period: float = 0.5) -> SwarmBatchTracker:
        # each with a key of its own: two trackers of one process would otherwise share one progress record
        tracker = SwarmBatchTracker(
            dht=two_dhts[peer], prefix="tracker_test", target_batch_size=target, min_refresh_period=0.2,
            max_refresh_period=max_refresh_period, default_refresh_period=0.2, private_key=RSAPrivateKey(),
            start=True,
        )  # fmt: skip
        made.append(tracker)
        return tracker

    yield make
    for tracker in made:
        tracker.shutdown()


def test_a_peer_counts_the_others_samples_and_ends_the_epoch_before_its_own_count_does(
    tracker_of: TrackerOf,
) -> None:
    trainer, watcher = tracker_of(0, 1000), tracker_of(1, 1000)
    trainer.report_local_progress(0, 600)
    watcher.report_local_progress(0, 300)
    assert not watcher.ready_to_update_epoch  # its own 300 are far from 1000
    wait_until(lambda: watcher.ready_to_update_epoch, 30, message="the watcher counts the other's 600")
    assert watcher.estimated_samples() >= 300 + 600


def test_a_peer_waiting_in_its_round_reports_a_rate_of_zero(
    tracker_of: TrackerOf,
) -> None:
    trainer, watcher = tracker_of(0, 10_000), tracker_of(1, 10_000)
    for samples in range(32, 640, 32):  # a training rate for its performance estimate
        trainer.report_local_progress(0, samples)
    with trainer.pause_updates():  # hivemind holds this while the epoch ends (the averaging round)
        assert trainer.local_progress.samples_per_second == 0.0

        def sees_it_waiting() -> bool:
            records = [r for r in watcher._others if r.epoch == 0]
            return bool(records) and records[0].rate == 0.0 and records[0].samples == 608

        wait_until(sees_it_waiting, 30, message="the other peer reads rate 0 with its final count")
        now = get_dht_time()
        assert watcher.estimated_samples(now + 60) == watcher.estimated_samples(now) == 608
        trainer.update_epoch(1)
    assert trainer.local_progress.samples_per_second > 0  # training again in its next epoch


def test_the_next_fetch_comes_soon_after_an_epoch_change_and_while_the_others_wait_in_a_round(
    tracker_of: TrackerOf,
) -> None:
    waiting, reader = tracker_of(0, 10_000), tracker_of(1, 10_000, max_refresh_period=30)
    for samples in range(32, 320, 32):
        waiting.report_local_progress(0, samples)
        reader.report_local_progress(0, samples)
    # both stop accumulating (their rounds): both records say rate 0, so hivemind's own ETA would be
    # unbounded and it would fetch again only after max_refresh_period (30 s here)
    with reader.pause_updates():
        pass  # its record now says rate 0 until its next report
    with waiting.pause_updates():

        def reads_both_waiting() -> bool:
            return reader.global_progress.num_peers == 2 and all(r.rate == 0.0 for r in reader._others)

        wait_until(reads_both_waiting, 30, message="reads both records at rate 0")
        assert reader.global_progress.next_fetch_time - get_dht_time() < 10
    with reader.pause_updates():
        reader.update_epoch(1)
    assert reader.global_progress.next_fetch_time - get_dht_time() <= reader.min_refresh_period


def test_epochs_shorter_than_the_refresh_period_do_not_put_the_next_fetch_off(
    tracker_of: TrackerOf,
) -> None:
    """A lone peer's epochs can last milliseconds: it must still fetch, or it never sees a newcomer."""
    lone, newcomer = tracker_of(0, 64), tracker_of(1, 64)
    newcomer.report_local_progress(0, 32)
    deadline = get_dht_time() + 30
    epoch = 0
    while not lone._others and get_dht_time() < deadline:
        with lone.pause_updates():  # an epoch every 50 ms, as a fast lone peer has
            epoch = lone.update_epoch(epoch + 1)
        time.sleep(0.05)
    assert lone._others, "the lone peer never fetched the newcomer's record"


@pytest.mark.parametrize("tracker_class", [SwarmBatchTracker, ProgressTracker])
def test_an_epoch_reached_by_download_is_the_swarms_epoch_at_once(
    two_dhts: tuple[hivemind.DHT, hivemind.DHT], tracker_class: type[ProgressTracker]
) -> None:
    """hivemind's optimizer sets the downloaded epoch with ``report_local_progress``, which leaves the
    tracker's global epoch at its last fetch: the swarm's epoch must not read behind the peer's own."""
    tracker = tracker_class(
        dht=two_dhts[0], prefix="download_test", target_batch_size=1000, private_key=RSAPrivateKey(),
        start=True,
    )  # fmt: skip
    try:
        wait_until(lambda: tracker.fetched_global_progress_this_epoch.is_set(), 30, message="a first fetch")
        tracker.report_local_progress(local_epoch=0, samples_accumulated=300)  # samples of epoch 0
        with tracker.pause_updates():  # as hivemind's load_state_from_peers holds it: no fetch in between
            tracker.report_local_progress(local_epoch=5, samples_accumulated=0)  # the download
            assert tracker.global_progress.epoch == 0  # hivemind's view until its next fetch
            progress = progress_from_tracker(tracker, 0.0)
            assert (progress.epoch, progress.samples_accumulated) == (5, 0)
    finally:
        tracker.shutdown()
