"""What a peer leaves in the DHT: its progress record, withdrawn by hivemind's goodbye unless the run is done.

Every worker of a run that reached its target leaves at about the same moment. If each one withdrew its
record, the orchestrator's reading at their deregistration (and any later one) would find no progress,
never see the final epoch, and relaunch workers for a run that is finished. So a peer that leaves
because the run reached its target keeps its last record until it expires.
"""

from __future__ import annotations

from typing import Any

import hivemind
import pytest

from tests.support.strategy import FAST_SWARM, digits, make_trainer
from worker.examples.digits import DigitsModule
from worker.strategy import HivemindStrategy

RUN_ID = "leaving"
STEPS = 4


def records_after_fit(keep: bool) -> dict[Any, Any]:
    """Train a lone peer (one swarm epoch a step) on a DHT it is given, as the worker agent does; the
    run's progress entries that DHT holds once the fit (and the strategy's teardown) ended."""
    dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    try:
        options = {k: v for k, v in FAST_SWARM.items() if k != "host_maddrs"}
        strategy = HivemindStrategy(target_batch_size=32, run_id=RUN_ID, dht=dht, **options)
        strategy.keep_progress_record = keep
        make_trainer(strategy, max_steps=STEPS).fit(DigitsModule(), digits(batch_size=32))
        found = dht.get(f"{RUN_ID}_progress", latest=True)
        return dict(found.value) if found is not None else {}
    finally:
        dht.shutdown()


@pytest.mark.timeout(120)
def test_a_peer_leaving_a_run_at_its_target_keeps_its_last_progress_record() -> None:
    entries = records_after_fit(keep=True)
    [entry] = entries.values()
    assert entry.value is not None and entry.value["epoch"] == STEPS


@pytest.mark.timeout(120)
def test_a_peer_leaving_otherwise_withdraws_its_progress_record() -> None:
    entries = records_after_fit(keep=False)
    assert [entry.value for entry in entries.values()] == [None]
