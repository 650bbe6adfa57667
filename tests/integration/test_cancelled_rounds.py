"""worker/_hivemind_compat.py: a cancelled averaging round leaves matchmaking, even when the process
that cancels it is descheduled half-way through the cancel.

Two real averagers on 127.0.0.1 (A holds ones, B threes). A's round is cancelled while B looks for a
group. The moment a loaded machine deschedules the cancelling process is made certain by delaying
hivemind's own state write (``MPFuture.cancel``) by half a second.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hivemind.averaging import DecentralizedAverager
from hivemind.averaging.control import AveragingStage, StepControl
from hivemind.utils.mpfuture import MPFuture
from hivemind.utils.timed_storage import get_dht_time

from tests.support.averagers import averager_pair
from tests.support.waiting import wait_until
from worker._hivemind_compat import cancel_rounds_before_signalling

pytestmark = pytest.mark.swarm  # timed rounds: the swarm lane runs them unstarved (tests/support/lanes.py)

A_VALUE, B_VALUE = 1.0, 3.0
ROUND_OPTS = {"target_group_size": 2, "min_matchmaking_time": 1.0, "request_timeout": 0.5}
B_TIMEOUT_S = 3.0
DESCHEDULED_S = 0.5


@pytest.fixture
def pair() -> Iterator[tuple[DecentralizedAverager, DecentralizedAverager]]:
    with averager_pair(
        (A_VALUE, B_VALUE), 4, prefix="cancelled", allreduce_timeout=2.0, **ROUND_OPTS
    ) as both:
        yield both


@pytest.fixture
def descheduled_cancel(monkeypatch: pytest.MonkeyPatch) -> None:
    """hivemind's state write of a cancelled round comes half a second late."""
    original = MPFuture.cancel

    def late(self: MPFuture[Any]) -> bool:
        if isinstance(self, StepControl):
            time.sleep(DESCHEDULED_S)
        return original(self)

    monkeypatch.setattr(MPFuture, "cancel", late)


def b_looks_while_a_cancels(
    a: DecentralizedAverager, b: DecentralizedAverager, cancel: Callable[[StepControl], Any]
) -> tuple[str, float]:
    """A schedules a round and cancels it (with ``cancel``) as B looks for a group: B's outcome and value."""
    control = a.step(scheduled_time=get_dht_time() + 1.0, wait=False, require_trigger=True, timeout=10)
    looking = AveragingStage.LOOKING_FOR_GROUP
    wait_until(lambda: control.stage == looking, 10, interval_s=0.01, message="A looks for a group")
    outcome: list[str] = []

    def b_round() -> None:
        try:
            group = b.step(timeout=B_TIMEOUT_S)
            outcome.append(f"averaged in a group of {len(group or {})}")
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test compares
            outcome.append(f"no group: {type(exc).__name__}")

    thread = threading.Thread(target=b_round)
    thread.start()
    cancel(control)
    thread.join(B_TIMEOUT_S + 10)
    assert not thread.is_alive(), "B's round did not end"
    with b.get_tensors() as tensors:
        return outcome[0], float(tensors[0][0])


def hivemind_cancel(control: StepControl) -> Any:
    """``StepControl.cancel`` as hivemind 1.1.12 ships it (whether or not the fix is installed)."""
    return getattr(StepControl.cancel, "__wrapped__", StepControl.cancel)(control)


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("descheduled_cancel")
def test_without_the_fix_a_cancelled_round_averages_with_a_groupmate(
    pair: tuple[DecentralizedAverager, DecentralizedAverager],
) -> None:
    """The failure the fix prevents (the reason it exists): B averages with A's cancelled round."""
    outcome, b_value = b_looks_while_a_cancels(*pair, hivemind_cancel)
    assert outcome == "averaged in a group of 2" and b_value == (A_VALUE + B_VALUE) / 2


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("descheduled_cancel")
def test_a_cancelled_round_leaves_and_the_next_rounds_find_each_other(
    pair: tuple[DecentralizedAverager, DecentralizedAverager],
) -> None:
    cancel_rounds_before_signalling()
    cancel_rounds_before_signalling()  # idempotent
    assert getattr(StepControl.cancel, "__wrapped__", None) is not None
    a, b = pair
    outcome, b_value = b_looks_while_a_cancels(a, b, StepControl.cancel)
    assert outcome == "no group: AllreduceException" and b_value == B_VALUE  # untouched by A's round

    groups: list[int] = []  # A's averager was left free: the next rounds meet
    threads = [
        threading.Thread(target=lambda p=p: groups.append(len(p.step(timeout=10) or {}))) for p in pair
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert groups == [2, 2]
    for peer in pair:
        with peer.get_tensors() as tensors:
            assert float(tensors[0][0]) == (A_VALUE + B_VALUE) / 2
