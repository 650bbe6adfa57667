"""Averaging outcomes a lone peer records: every swarm epoch applied locally because it is alone.

Two peers averaging, and rounds that time out, are checked with real peers in
``tests/integration/test_swarm_training.py`` and ``tests/e2e/test_averaging_outcomes.py``.
"""

from __future__ import annotations

import pytest

from tests.support.strategy import digits, make_strategy, make_trainer
from worker.examples.digits import DigitsModule
from worker.strategy.outcomes import Outcome, round_outcome

pytestmark = pytest.mark.timeout(60)


def test_a_lone_peer_counts_each_epoch_as_local_because_alone() -> None:
    strategy = make_strategy(target_batch_size=32)
    assert strategy.averaging_outcomes() is None  # before fit
    make_trainer(strategy, max_steps=8).fit(DigitsModule(), datamodule=digits(batch_size=32))
    counts = strategy.averaging_outcomes()
    assert counts is not None
    assert counts.alone == strategy.optimizer.local_epoch >= 4, counts
    assert counts.averaged == counts.no_group == counts.timeout == counts.failed == counts.downloaded == 0
    assert counts.group_size_sum == 0 and counts.epochs == counts.alone


def test_no_round_is_alone() -> None:
    assert round_outcome(None) == (Outcome.alone, 0)
