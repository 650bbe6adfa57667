"""Run and worker lifecycles (orchestrator/domain/states.py, runs.py, workers.py, checkpointer.py) on a fresh
SQLite database per test."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from orchestrator.db.models import Event, Run, Worker
from orchestrator.db.session import Database
from orchestrator.domain import checkpoints, runs, workers
from orchestrator.domain.checkpointer import elect_checkpointer
from orchestrator.domain.states import StopCause
from orchestrator.errors import (
    Conflict,
    Forbidden,
    IllegalTransition,
    InvalidRequest,
    RunExists,
    RunNotAcceptingWorkers,
    Unauthorized,
)
from worker.protocol.runs import RunSpec, RunState, StopCondition
from worker.protocol.workers import DeregisterReason, WorkerRegister, WorkerState

T0 = datetime(2026, 1, 1, tzinfo=UTC)
_names = itertools.count()

# The lifecycles as the docs state them (docs/concepts/runs.md and workers.md), written out here so
# that a wrong edit of the tables in orchestrator/domain/states.py fails these tests.
EXPECTED_RUN_TRANSITIONS = {
    ("pending", "running"),
    ("pending", "stopping"),
    ("pending", "failed"),
    ("running", "stopping"),
    ("running", "completed"),
    ("running", "failed"),
    ("stopping", "stopped"),
    ("stopping", "completed"),
    ("stopping", "failed"),
    ("stopped", "pending"),
    ("failed", "pending"),
    ("completed", "pending"),
}
EXPECTED_WORKER_TRANSITIONS = {
    ("launching", "running"),
    ("launching", "lost"),
    ("launching", "interrupted"),
    ("launching", "exited"),
    ("launching", "failed"),
    ("running", "lost"),
    ("running", "interrupted"),
    ("running", "exited"),
    ("running", "failed"),
    ("lost", "running"),
    ("lost", "interrupted"),
    ("lost", "exited"),
    ("lost", "failed"),
}
FINAL_WORKER_STATES = {"interrupted", "exited", "failed"}  # no transition leaves them: ended_at is set


def spec(**overrides: object) -> RunSpec:
    values: dict[str, object] = {
        "name": f"r{next(_names)}",
        "module": "a.b:C",
        "datamodule": "a.b:D",
        "target_batch_size": 64,
        "batch_size": 8,
        "min_workers": 0,
        "max_workers": 4,
        "desired_workers": 2,
    }
    values.update(overrides)
    return RunSpec.model_validate(values)


def new_run(db: Database, **overrides: object) -> tuple[str, str]:
    with db.begin() as session:
        run, token = runs.create_run(session, spec(**overrides), T0)
        return run.name, token


def join(db: Database, token: str, at: datetime = T0, **body: object) -> int:
    with db.begin() as session:
        return workers.register_worker(session, token, WorkerRegister.model_validate(body), at).worker.id


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("old", "new"), list(itertools.product(RunState, RunState)))
def test_run_transitions_follow_the_table(db: Database, old: RunState, new: RunState) -> None:
    name, _ = new_run(db)
    with db.begin() as session:
        run = runs.get_run(session, name)
        run.state = old
    with db.begin() as session:
        run = runs.get_run(session, name)
        if old == new:
            assert runs.set_run_state(session, run, new, "again", T0) is False
        elif (old.value, new.value) in EXPECTED_RUN_TRANSITIONS:
            assert runs.set_run_state(session, run, new, "test", T0) is True
            assert run.state == new and run.state_reason == "test"
        else:
            with pytest.raises(IllegalTransition):
                runs.set_run_state(session, run, new, "test", T0)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("old", "new"), list(itertools.product(WorkerState, WorkerState)))
def test_worker_transitions_follow_the_table(db: Database, old: WorkerState, new: WorkerState) -> None:
    name, _ = new_run(db)
    with db.begin() as session:
        worker = workers.create_launch_intent(session, runs.get_run(session, name), T0).worker
        worker.state = old
        worker_id = worker.id
    with db.begin() as session:
        worker = runs.get_worker(session, worker_id)
        if old == new:
            assert runs.set_worker_state(session, worker, new, "again", T0) is False
        elif (old.value, new.value) in EXPECTED_WORKER_TRANSITIONS:
            assert runs.set_worker_state(session, worker, new, "test", T0) is True
            assert (worker.ended_at is not None) == (new.value in FINAL_WORKER_STATES)
        else:
            with pytest.raises(IllegalTransition):
                runs.set_worker_state(session, worker, new, "test", T0)


def test_the_expected_tables_name_every_state() -> None:
    """The literal tables above cover the enums: a state added without a decision here fails."""
    assert {s for pair in EXPECTED_RUN_TRANSITIONS for s in pair} == {s.value for s in RunState}
    assert {s for pair in EXPECTED_WORKER_TRANSITIONS for s in pair} == {s.value for s in WorkerState}


@pytest.mark.timeout(30)
def test_create_rejects_a_taken_name_and_stores_only_the_token_hash(db: Database) -> None:
    name, token = new_run(db)
    with db.begin() as session, pytest.raises(RunExists):
        runs.create_run(session, spec(name=name), T0)
    with db.read() as session:
        run = runs.get_run(session, name)
        assert token not in run.join_token_hash and len(run.join_token_hash) == 64
        assert run.swarm_id.startswith(f"{name}-") and run.state == "pending"


@pytest.mark.timeout(30)
def test_launch_intent_is_written_before_launch_and_binds_registration(db: Database) -> None:
    name, join_token = new_run(db)
    with db.begin() as session:
        intent = workers.create_launch_intent(session, runs.get_run(session, name), T0, {"zone": "z1"})
        request_id, worker_id, launch_token = intent.worker.request_id, intent.worker.id, intent.token
    with db.read() as session:  # committed, launching, before any launcher was called
        row = runs.get_worker(session, worker_id)
        assert row.state == "launching" and row.request_id == request_id and row.registered_at is None
    assert join(db, launch_token, request_id=request_id, hostname="h") == worker_id
    with db.read() as session:
        row = runs.get_worker(session, worker_id)
        assert row.state == "running" and row.launch_details == {"zone": "z1"} and not row.manual
        assert runs.get_run(session, name).state == "running"
    with pytest.raises(Conflict):  # a join token never binds another worker's row, even a launching one
        join(db, join_token, request_id=request_id)
    assert join(db, join_token) != worker_id  # a new, manual worker


@pytest.mark.timeout(30)
def test_launch_token_registers_once_reissued_token_replaces_it(db: Database) -> None:
    name, _ = new_run(db)
    with db.begin() as session:
        intent = workers.create_launch_intent(session, runs.get_run(session, name), T0)
        worker = intent.worker
        new_token = workers.reissue_launch_token(worker)
    with pytest.raises(Unauthorized):
        join(db, intent.token)
    assert join(db, new_token) == worker.id
    with db.begin() as session, pytest.raises(Conflict):
        workers.reissue_launch_token(runs.get_worker(session, worker.id))


@pytest.mark.timeout(30)
def test_registration_is_refused_for_bad_tokens_foreign_requests_and_stopped_runs(db: Database) -> None:
    name_a, token_a = new_run(db)
    name_b, _ = new_run(db)
    with db.begin() as session:
        intent_a = workers.create_launch_intent(session, runs.get_run(session, name_a), T0)
        request_b = workers.create_launch_intent(session, runs.get_run(session, name_b), T0).worker.request_id
    with pytest.raises(Unauthorized):
        join(db, "ssj_wrong")
    with pytest.raises(Unauthorized):
        join(db, "ssl_wrong")
    with pytest.raises(Conflict):
        join(db, token_a, request_id=request_b)
    with pytest.raises(Forbidden):  # a launch token binds only its own row
        join(db, intent_a.token, request_id=request_b)
    with db.begin() as session:
        runs.stop_run(session, runs.get_run(session, name_a), "test", T0)
    with pytest.raises(RunNotAcceptingWorkers):
        join(db, token_a)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("swarm_epoch", "final"), [(1, "stopped"), (2, "completed")])
def test_stop_waits_for_live_workers_and_the_last_one_leaving_ends_the_run(
    db: Database, swarm_epoch: int, final: str
) -> None:
    """The target counts as met by the swarm epoch the DHT showed (2 epochs of 64 samples >= 100), never
    by the samples workers report (110 here either way)."""
    name, token = new_run(db, stop={"target_samples": 100})
    ids = [join(db, token), join(db, token)]
    with db.begin() as session:
        run = runs.get_run(session, name)
        run.swarm_epoch = swarm_epoch
        runs.stop_run(session, run, "test", T0)
        assert run.state == "stopping" and run.stop_requested_at == T0
    for worker_id, samples in zip(ids, (30, 80), strict=True):
        with db.begin() as session:
            worker = runs.get_worker(session, worker_id)
            worker.samples, worker.swarm_epoch = samples, 1000
            workers.deregister_worker(session, worker, DeregisterReason.completed, None, T0)
    with db.read() as session:
        run = runs.get_run(session, name)
        assert run.state == final and run.finished_at == T0
        kinds = session.scalars(select(Event.kind).where(Event.run_id == run.id)).all()
    assert kinds.count("worker.state") == 2 and kinds.count("run.state") >= 3


@pytest.mark.timeout(30)
def test_a_completed_run_resumes_from_its_checkpoint_with_a_target_it_has_not_reached(db: Database) -> None:
    name, _ = new_run(db, stop={"target_epochs": 5})
    with db.begin() as session:
        run = runs.get_run(session, name)
        run.state, run.swarm_epoch = RunState.completed, 7
        checkpoints.record_checkpoint(
            session, run, epoch=5, key="k", size_bytes=1, sha256="0" * 64, worker_id=None, now=T0
        )
    with db.begin() as session, pytest.raises(Conflict, match="higher target"):
        runs.resume_run(session, runs.get_run(session, name), T0)
    with db.begin() as session, pytest.raises(Conflict):
        runs.resume_run(session, runs.get_run(session, name), T0, StopCondition(target_samples=5 * 64))
    with db.begin() as session:
        run = runs.get_run(session, name)
        runs.resume_run(session, run, T0, StopCondition(target_epochs=10))
        # the swarm starts again from the checkpoint: its epochs count from there
        assert (run.state, run.target_epochs, run.target_samples, run.swarm_epoch) == ("pending", 10, None, 5)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("cause", "final"), [(StopCause.target_reached, "completed"), (StopCause.user, "stopped")]
)
def test_a_run_stopped_at_its_target_completes_though_the_reports_lag(
    db: Database, cause: StopCause, final: str
) -> None:
    """The reconcile loop saw the target met (on the DHT): the run completes, even though the last
    worker's reports stayed one epoch short; a run stopped by hand short of its target is stopped,
    whatever its reason says."""
    name, token = new_run(db, stop={"target_epochs": 10})
    worker_id = join(db, token)
    with db.begin() as session:
        run = runs.get_run(session, name)
        run.state = RunState.running
        runs.get_worker(session, worker_id).swarm_epoch = 9
        runs.stop_run(session, run, "stop condition reached", T0, cause)
        assert run.stop_cause == cause
    with db.begin() as session:
        worker = runs.get_worker(session, worker_id)
        workers.deregister_worker(session, worker, DeregisterReason.completed, None, T0)
    with db.read() as session:
        assert runs.get_run(session, name).state == final


@pytest.mark.timeout(30)
def test_stop_without_workers_stops_at_once_and_resume_resets(db: Database) -> None:
    name, _ = new_run(db)
    with db.begin() as session:
        run = runs.get_run(session, name)
        run.consecutive_start_failures = 3
        runs.stop_run(session, run, "test", T0)
        assert run.state == "stopped" and run.stop_cause == StopCause.user
        runs.stop_run(session, run, "again", T0)  # a no-op
        runs.resume_run(session, run, T0)
        assert run.state == "pending" and run.consecutive_start_failures == 0 and run.finished_at is None
        assert run.stop_cause is None
        with pytest.raises(IllegalTransition):
            runs.resume_run(session, run, T0)
        with pytest.raises(IllegalTransition):
            runs.delete_run(session, run)


@pytest.mark.timeout(30)
def test_scale_checks_bounds_and_state(db: Database) -> None:
    name, _ = new_run(db)
    with db.begin() as session:
        run = runs.get_run(session, name)
        runs.scale_run(session, run, 4, T0)
        with pytest.raises(InvalidRequest):
            runs.scale_run(session, run, 5, T0)
        with pytest.raises(InvalidRequest):
            runs.scale_run(session, run, 1, T0, min_workers=3, max_workers=2)
        runs.scale_run(session, run, 6, T0, max_workers=8)
        assert (run.min_workers, run.desired_workers, run.max_workers) == (0, 6, 8)
        runs.stop_run(session, run, "test", T0)
        with pytest.raises(IllegalTransition):
            runs.scale_run(session, run, 1, T0)


@pytest.mark.timeout(30)
def test_one_checkpointer_is_elected_and_replaced_when_it_goes(db: Database) -> None:
    name, token = new_run(db, hand_joined_checkpoint=True)  # its workers join by hand
    first, second = join(db, token, T0), join(db, token, T0 + timedelta(seconds=1))
    now = T0 + timedelta(seconds=5)
    with db.begin() as session:
        assert elect_checkpointer(session, runs.get_run(session, name), now, 30) == first
        assert elect_checkpointer(session, runs.get_run(session, name), now, 30) == first  # stable
    with db.begin() as session:
        workers.request_retire(session, runs.get_worker(session, first), "scale down", now)
        assert elect_checkpointer(session, runs.get_run(session, name), now, 30) == second
    with db.begin() as session:
        runs.set_worker_state(session, runs.get_worker(session, second), WorkerState.lost, "silent", now)
        assert runs.get_run(session, name).checkpointer_worker_id is None
        assert elect_checkpointer(session, runs.get_run(session, name), now, 30) is None
    late = T0 + timedelta(seconds=60)  # the retiring one is excluded, a silent one too
    with db.begin() as session:
        assert elect_checkpointer(session, runs.get_run(session, name), late, 30) is None


@pytest.mark.timeout(30)
def test_delete_removes_everything_of_a_finished_run(db: Database) -> None:
    name, token = new_run(db)
    join(db, token)
    with db.begin() as session:
        run = runs.get_run(session, name)
        runs.stop_run(session, run, "test", T0)
        assert run.state == "stopping"
        for worker in runs.live_workers(session, run.id):
            runs.set_worker_state(session, worker, WorkerState.exited, "gone", T0)
        assert run.state == "stopped"
        assert runs.delete_run(session, run) == []
    with db.read() as session:
        assert session.scalars(select(Run)).all() == []
        assert session.scalars(select(Worker)).all() == []
        assert session.scalars(select(Event)).all() == []


def test_stop_condition_model_is_shared_with_the_wire_format() -> None:
    assert StopCondition().target_epochs is None and spec().stop == StopCondition()
