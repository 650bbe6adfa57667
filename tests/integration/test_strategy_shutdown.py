"""What a leaving peer's progress record says (worker/strategy/shutdown.py), on a real DHT peer on 127.0.0.1.

hivemind 1.1.12's progress reporter cancels its last store when it stops, and may stop before it took the
last report at all: a peer that keeps its record on leaving must store that last report itself.
"""

from __future__ import annotations

import hivemind
import pytest
from hivemind.utils.crypto import RSAPrivateKey

from tests.support.waiting import wait_until
from worker.strategy.shutdown import stop_tracker_keeping_record
from worker.strategy.tracker import SwarmBatchTracker

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(90)]

PREFIX = "leaving_test"


def _stored_epoch(dht: hivemind.DHT) -> int | None:
    found = dht.get(f"{PREFIX}_progress", latest=True, return_future=True).result(timeout=15)
    if found is None or not isinstance(found.value, dict):
        return None
    [entry] = found.value.values()
    return None if entry.value is None else int(entry.value["epoch"])


def test_a_peer_keeping_its_record_leaves_the_epoch_it_reported_last(lone_dht: hivemind.DHT) -> None:
    tracker = SwarmBatchTracker(
        dht=lone_dht, prefix=PREFIX, target_batch_size=32, min_refresh_period=0.2, max_refresh_period=0.5,
        default_refresh_period=0.2, private_key=RSAPrivateKey(), start=True,
    )  # fmt: skip
    try:
        tracker.report_local_progress(3, 16)  # hivemind reports a peer that accumulated samples only
        wait_until(lambda: _stored_epoch(lone_dht) == 3, 20, message="the reporter stores epoch 3")
        # the last step of a run ends its epoch, and the peer leaves right away
        tracker.report_local_progress(4, 0)
        stop_tracker_keeping_record(tracker, timeout=10)
        assert _stored_epoch(lone_dht) == 4
    finally:
        tracker.shutdown(10)  # a no-op once the peer left keeping its record
        tracker.join(10)
