"""Worker indexes and the crash budget (orchestrator/domain/workers.py, crash_budget.py) on a fresh SQLite
database."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from orchestrator.db.models import Event
from orchestrator.db.session import Database
from orchestrator.domain import runs, workers
from orchestrator.domain.crash_budget import CrashPolicy
from tests.unit.test_runs_lifecycle import T0, join, new_run
from worker.protocol.workers import DeregisterReason, WorkerRegister

BUG = "training failed: RuntimeError: the model diverged in a buggy layer"


def launched_worker(db: Database, name: str, samples: int = 100) -> int:
    """A worker launched by the reconciler (a launch intent, then registration), that trained ``samples``."""
    with db.begin() as session:
        intent = workers.create_launch_intent(session, runs.get_run(session, name), T0)
        request_id, token = intent.worker.request_id, intent.token
    worker_id = join(db, token, request_id=request_id)
    with db.begin() as session:
        runs.get_worker(session, worker_id).samples = samples
    return worker_id


def leave(
    db: Database, worker_id: int, reason: DeregisterReason, message: str | None, minutes: float = 1.0
) -> str:
    """Deregister ``worker_id`` ``minutes`` after T0 (default policy: 5 crashes an hour); the run's state."""
    with db.begin() as session:
        worker = runs.get_worker(session, worker_id)
        at = T0 + timedelta(minutes=minutes)
        workers.deregister_worker(session, worker, reason, message, at, CrashPolicy())
        return worker.run.state


@pytest.mark.timeout(30)
def test_worker_index_is_the_lowest_free_slot_and_a_replacement_takes_it_again(db: Database) -> None:
    name, token = new_run(db)
    first, second, third = (join(db, token) for _ in range(3))
    with db.read() as session:
        assert [runs.get_worker(session, w).worker_index for w in (first, second, third)] == [0, 1, 2]
        assert workers.count_running_workers(session, runs.get_run(session, name).id) == 3
    leave(db, second, DeregisterReason.interrupted, None)
    replacement = join(db, token)
    with db.read() as session:
        assert runs.get_worker(session, replacement).worker_index == 1
        assert workers.count_running_workers(session, runs.get_run(session, name).id) == 3
    with db.begin() as session:  # the same worker registering again keeps its slot
        worker = runs.get_worker(session, third)
        assert workers.assign_worker_index(session, worker) == 2


@pytest.mark.timeout(30)
def test_joins_in_one_transaction_fill_the_free_slots_then_go_past_the_highest(db: Database) -> None:
    """A batch of registrations shares one transaction and reads the run's slots once
    (domain/roster.py): each still gets the lowest free slot, gaps first."""
    name, token = new_run(db, max_workers=10)
    joined = [join(db, token) for _ in range(4)]
    leave(db, joined[0], DeregisterReason.interrupted, None)
    leave(db, joined[2], DeregisterReason.interrupted, None)
    with db.begin() as session:
        batch = [workers.register_worker(session, token, WorkerRegister(), T0).worker for _ in range(4)]
        assert [w.worker_index for w in batch] == [0, 2, 4, 5]
        assert workers.count_running_workers(session, runs.get_run(session, name).id) == 6
    with db.begin() as session:  # the next transaction reads them back: dense again, 6 is next
        assert workers.register_worker(session, token, WorkerRegister(), T0).worker.worker_index == 6


@pytest.mark.timeout(30)
def test_the_run_fails_once_its_crash_budget_is_spent_and_every_failure_event_says_why(
    db: Database,
) -> None:
    name, _ = new_run(db, max_worker_crashes=3)
    crashed = [launched_worker(db, name) for _ in range(3)]
    assert leave(db, crashed[0], DeregisterReason.error, BUG) == "running"
    assert leave(db, crashed[1], DeregisterReason.error, BUG) == "running"
    assert leave(db, crashed[2], DeregisterReason.error, BUG) == "failed"
    with db.read() as session:
        run = runs.get_run(session, name)
        assert run.state_reason == f"3 workers failed with the same error after training: error: {BUG}"
        assert run.consecutive_start_failures == 0  # they had trained: not start-up failures
        events = session.scalars(select(Event).where(Event.kind == "worker.state", Event.run_id == run.id))
        failed = [e for e in events if "-> failed" in e.message]
        assert len(failed) == 3 and all(BUG in e.message for e in failed), [e.message for e in failed]


@pytest.mark.timeout(30)
def test_churn_hand_joined_workers_other_errors_and_old_crashes_never_spend_the_budget(
    db: Database,
) -> None:
    name, token = new_run(db, max_worker_crashes=2)
    for _ in range(3):  # spot churn
        assert (
            leave(db, launched_worker(db, name), DeregisterReason.interrupted, "spot interruption")
            == "running"
        )
    for _ in range(3):  # a join token's holder
        manual = join(db, token)
        with db.begin() as session:
            runs.get_worker(session, manual).samples = 10
        assert leave(db, manual, DeregisterReason.error, BUG) == "running"
    assert leave(db, launched_worker(db, name), DeregisterReason.error, BUG, minutes=1) == "running"
    assert leave(db, launched_worker(db, name), DeregisterReason.error, "CUDA out of memory") == "running"
    # the second crash with BUG comes after the window (an hour) of the first: still within the budget
    assert leave(db, launched_worker(db, name), DeregisterReason.error, BUG, minutes=62) == "running"
    assert leave(db, launched_worker(db, name), DeregisterReason.error, BUG, minutes=63) == "failed"


@pytest.mark.timeout(30)
def test_the_server_default_budget_applies_when_the_spec_sets_none(db: Database) -> None:
    name, _ = new_run(db)
    states = [leave(db, launched_worker(db, name), DeregisterReason.error, BUG) for _ in range(5)]
    assert states == ["running"] * 4 + ["failed"]


UNUSABLE = "cannot build shapes.model:ShapesNet: ValueError: this model needs a GPU"


def leave_unusable(db: Database, worker_id: int) -> str:
    """Deregister ``worker_id`` as its agent does when it exits with code 3; the run's state and reason."""
    with db.begin() as session:
        worker = runs.get_worker(session, worker_id)
        at = T0 + timedelta(minutes=1)
        workers.deregister_worker(session, worker, DeregisterReason.error, UNUSABLE, at, unusable_spec=True)
        return f"{worker.run.state}: {worker.run.state_reason}"


@pytest.mark.timeout(30)
def test_the_first_launched_worker_that_cannot_use_the_spec_fails_the_run_with_its_message(
    db: Database,
) -> None:
    name, _ = new_run(db)
    first = launched_worker(db, name, samples=0)
    assert leave_unusable(db, first) == f"failed: worker {first} cannot use the run's spec: {UNUSABLE}"


@pytest.mark.timeout(30)
def test_an_unusable_spec_fails_no_run_a_live_worker_trains_with_nor_by_a_hand_joined_worker(
    db: Database,
) -> None:
    name, token = new_run(db)
    training = launched_worker(db, name, samples=640)
    replacement = launched_worker(db, name, samples=0)
    # the spec works on another worker: this one met something of its own, a start-up failure
    assert leave_unusable(db, replacement) == f"running: worker {training} registered"
    by_hand = join(db, token)
    leave(db, training, DeregisterReason.stopped, None)
    assert leave_unusable(db, by_hand).startswith("running: ")  # a join token's holder fails no run
    with db.read() as session:
        assert runs.get_run(session, name).consecutive_start_failures == 1  # the launched one only
