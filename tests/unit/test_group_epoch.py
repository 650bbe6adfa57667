"""What a gradient round's groupmates say about the epoch they enter: ``group_next_epoch``.

Each peer of the strategy sends its groupmates ``{"next_epoch": local_epoch + 1}`` with its gradient
round (hivemind's all-gather); a peer one epoch behind a groupmate then takes that epoch, so that both
agree on when ``average_state_every`` is due. These are hivemind's own step controls, finished the way
its averager finishes them.
"""

from __future__ import annotations

from typing import Any

from hivemind.averaging.control import StepControl
from hivemind.utils import MPFuture, get_dht_time

from worker.strategy.optimizer import NEXT_EPOCH_KEY, group_next_epoch


def _control() -> StepControl:
    """A control as hivemind's averager makes it, attached and triggered (the round was let go)."""
    trigger: MPFuture[None] = MPFuture()  # a plain MPFuture first: it sets up this process's backend
    now = get_dht_time()
    control = StepControl(
        scheduled_time=now, deadline=now + 10, allow_retries=True, weight=1.0, data_for_gather=b""
    )
    control.attach(trigger, MPFuture())
    trigger.set_result(None)
    return control


def _finished(gathered: dict[Any, Any]) -> StepControl:
    control = _control()
    control.set_result(gathered)
    return control


def test_the_highest_epoch_a_groupmate_enters_is_the_groups() -> None:
    gathered = {"peer-a": {NEXT_EPOCH_KEY: 7}, "peer-b": {NEXT_EPOCH_KEY: 8}, "peer-c": {NEXT_EPOCH_KEY: 7}}
    assert group_next_epoch(_finished(gathered)) == 8


def test_peers_that_say_nothing_are_left_out() -> None:
    # a peer of another version (lightning-hivemind, a hand-made hivemind.Optimizer) gathers None
    assert group_next_epoch(_finished({"old": None, "new": {NEXT_EPOCH_KEY: 5}})) == 5
    assert group_next_epoch(_finished({"old": None, "odd": {NEXT_EPOCH_KEY: "5"}})) is None


def test_a_round_that_did_not_average_says_nothing() -> None:
    assert group_next_epoch(None) is None
    pending = _control()
    assert group_next_epoch(pending) is None
    failed = _control()
    failed.set_exception(RuntimeError("Averaging step failed: could not find a group"))
    assert group_next_epoch(failed) is None
    cancelled = _control()
    cancelled.cancel()
    assert group_next_epoch(cancelled) is None
