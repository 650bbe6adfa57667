"""hivemind behaviour docs/guides/strategy.md describes: a groupmate whose trainer reaches the step later
than ``next_chunk_timeout`` is left out of the round; a longer ``next_chunk_timeout`` keeps it in.

Two real averagers on 127.0.0.1 (A holds ones, B threes) form a group for a pre-scheduled round, as
``hivemind.Optimizer``'s peers do, and each enters the all-reduce when its trainer allows it. B's trainer
comes ``LATE_S`` after A's, as on a busy machine. With the chunk timeout ``hivemind.Optimizer`` picks
(the matchmaking window, 1 s in the demo) A leaves B out and A does not hold the average; with half the
averaging timeout both hold it. Each side has 2 s of margin: with 1 s (B 2 s late, a 3.3 s chunk timeout)
a run of the whole suite on a loaded machine once saw A wait for B past hivemind's 1 s.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hivemind.averaging import DecentralizedAverager
from hivemind.averaging.control import AveragingStage, StepControl
from hivemind.utils.timed_storage import get_dht_time

from tests.support.averagers import averager_pair
from tests.support.waiting import wait_until
from worker.strategy.keywords import averager_options

pytestmark = pytest.mark.swarm  # timed rounds: the swarm lane runs them unstarved (tests/support/lanes.py)

A_VALUE, B_VALUE = 1.0, 3.0
AVERAGE = (A_VALUE + B_VALUE) / 2
#: the demo's and the tests' strategy settings
MATCHMAKING_S, AVERAGING_TIMEOUT_S = 1.0, 10.0
#: how much later B's trainer allows its all-reduce than A's
LATE_S = 3.0
#: a chunk timeout longer than B is late, within the round's bound
LONGER_CHUNK_TIMEOUT_S = AVERAGING_TIMEOUT_S / 2


def averaged_pair(next_chunk_timeout: float) -> Iterator[tuple[DecentralizedAverager, DecentralizedAverager]]:
    opts: dict[str, Any] = {
        "prefix": "late",
        "target_group_size": 2,
        "min_matchmaking_time": MATCHMAKING_S,
        "allreduce_timeout": AVERAGING_TIMEOUT_S,
        "next_chunk_timeout": next_chunk_timeout,
        **averager_options(None, MATCHMAKING_S),  # the request timeout a worker's averagers get
    }
    with averager_pair((A_VALUE, B_VALUE), 64, **opts) as pair:
        yield pair


@pytest.fixture
def hivemind_chunk_timeout() -> Iterator[tuple[DecentralizedAverager, DecentralizedAverager]]:
    """``hivemind.Optimizer``'s own choice: the matchmaking window."""
    yield from averaged_pair(MATCHMAKING_S)


@pytest.fixture
def longer_chunk_timeout() -> Iterator[tuple[DecentralizedAverager, DecentralizedAverager]]:
    yield from averaged_pair(LONGER_CHUNK_TIMEOUT_S)


def b_comes_late(a: DecentralizedAverager, b: DecentralizedAverager) -> list[list[float]]:
    """A pre-scheduled round for both; B's trainer allows its all-reduce ``LATE_S`` after A's. Each
    side's distinct values afterwards."""
    when = get_dht_time() + MATCHMAKING_S
    controls: list[StepControl] = [
        peer.step(scheduled_time=when, wait=False, require_trigger=True, timeout=AVERAGING_TIMEOUT_S)
        for peer in (a, b)
    ]
    grouped = (AveragingStage.AWAITING_TRIGGER, AveragingStage.RUNNING_ALLREDUCE)
    wait_until(lambda: all(c.stage in grouped for c in controls), 10, message="A and B form a group")
    controls[0].allow_allreduce()
    late = threading.Timer(LATE_S, controls[1].allow_allreduce)  # B's trainer, descheduled
    late.start()
    try:
        for control in controls:
            try:
                control.result(timeout=AVERAGING_TIMEOUT_S + LATE_S + 5)
            except Exception as exc:  # noqa: BLE001 - the tensors are what the test compares
                print(f"a round ended with {type(exc).__name__}: {exc}")
    finally:
        late.join()
    values = []
    for peer in (a, b):
        with peer.get_tensors() as tensors:
            values.append(sorted(set(tensors[0].tolist())))
    return values


@pytest.mark.timeout(90)
def test_with_hiveminds_chunk_timeout_a_late_groupmate_is_left_out(
    hivemind_chunk_timeout: tuple[DecentralizedAverager, DecentralizedAverager],
) -> None:
    assert LONGER_CHUNK_TIMEOUT_S > LATE_S > MATCHMAKING_S
    values = b_comes_late(*hivemind_chunk_timeout)
    assert values[0] != [AVERAGE], values  # A's own part was averaged without B's tensors


@pytest.mark.timeout(90)
def test_with_a_longer_chunk_timeout_a_late_groupmate_averages(
    longer_chunk_timeout: tuple[DecentralizedAverager, DecentralizedAverager],
) -> None:
    assert b_comes_late(*longer_chunk_timeout) == [[AVERAGE], [AVERAGE]]
