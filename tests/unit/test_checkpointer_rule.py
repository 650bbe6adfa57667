"""The checkpointer eligibility rule (orchestrator/domain/checkpointer.py), on plain values: the election
over database rows and the heartbeat writer's check over its cache both apply it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from orchestrator.domain.checkpointer import Contender, eligible
from orchestrator.domain.states import WorkerState

NOW = datetime(2026, 1, 1, tzinfo=UTC)
FRESH_AFTER = NOW - timedelta(seconds=30)


def worker(
    worker_id: int,
    epoch: int = 10,
    state: WorkerState = WorkerState.running,
    retiring: bool = False,
    silent_s: float | None = 1.0,
) -> Contender:
    last_seen = None if silent_s is None else NOW - timedelta(seconds=silent_s)
    return Contender(worker_id, state, retiring, last_seen, epoch)


def ids(contenders: list[Contender]) -> list[int]:
    return [c.worker_id for c in contenders]


def test_only_running_fresh_workers_that_stay_are_eligible_in_the_order_given() -> None:
    workers = [
        worker(5),
        worker(1, state=WorkerState.lost),
        worker(2, state=WorkerState.launching, silent_s=None),
        worker(3, retiring=True),
        worker(4, silent_s=31),
        worker(6, silent_s=None),
        worker(7),
    ]
    assert ids(eligible(workers, swarm_epoch=10, every_epochs=5, fresh_after=FRESH_AFTER)) == [5, 7]


def test_a_worker_more_than_every_epochs_behind_the_lead_is_not_eligible() -> None:
    workers = [worker(1, epoch=4), worker(2, epoch=5), worker(3, epoch=10)]
    assert ids(eligible(workers, swarm_epoch=10, every_epochs=5, fresh_after=FRESH_AFTER)) == [2, 3]


def test_epochs_count_only_up_to_the_swarms() -> None:
    """A worker claiming epoch 1000 leads no one: it counts as the swarm's epoch 10."""
    workers = [worker(1, epoch=1000), worker(2, epoch=6)]
    assert ids(eligible(workers, swarm_epoch=10, every_epochs=5, fresh_after=FRESH_AFTER)) == [1, 2]
    assert ids(eligible(workers, swarm_epoch=12, every_epochs=5, fresh_after=FRESH_AFTER)) == [1]


def test_a_lagging_worker_that_goes_silent_stops_setting_the_lead() -> None:
    workers = [worker(1, epoch=3), worker(2, epoch=10, silent_s=60)]
    assert ids(eligible(workers, swarm_epoch=10, every_epochs=5, fresh_after=FRESH_AFTER)) == [1]


def test_an_excused_worker_keeps_the_role_while_silent_but_not_once_it_retires() -> None:
    workers = [worker(1, silent_s=300), worker(2)]
    assert ids(eligible(workers, 10, 5, FRESH_AFTER)) == [2]
    assert ids(eligible(workers, 10, 5, FRESH_AFTER, excused=1)) == [1, 2]
    retiring = [worker(1, silent_s=300, retiring=True)]
    assert eligible(retiring, 10, 5, FRESH_AFTER, excused=1) == []


def test_no_contenders_none_eligible() -> None:
    assert eligible([], swarm_epoch=10, every_epochs=5, fresh_after=FRESH_AFTER) == []
