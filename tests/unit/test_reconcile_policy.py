"""The reconcile loop's decisions, rule by rule, on plain views (no processes, no database)."""

from __future__ import annotations

from orchestrator.domain.states import StopCause
from orchestrator.reconciler.policy import (
    FailureView,
    InstanceView,
    ReconcileSettings,
    RunView,
    WorkerView,
    plan_run,
)
from worker.protocol.runs import RunState, StopCondition
from worker.protocol.workers import WorkerState

POLICY = ReconcileSettings(
    heartbeat_timeout_s=10, launch_timeout_s=60, retire_grace_s=5, max_start_failures=3
)
NOW = 1000.0


def run(**kw: object) -> RunView:
    base: dict[str, object] = dict(
        name="r", state=RunState.running, desired_workers=2, stop=StopCondition(target_epochs=10)
    )
    base.update(kw)
    return RunView(**base)  # type: ignore[arg-type]


def worker(wid: str, state: WorkerState = WorkerState.running, **kw: object) -> WorkerView:
    base: dict[str, object] = dict(
        id=wid,
        request_id=f"req-{wid}",
        state=state,
        created_at=NOW - 20,
        registered=True,
        last_heartbeat_at=NOW - 1,
    )
    base.update(kw)
    return WorkerView(**base)  # type: ignore[arg-type]


def alive(*ids: str, is_alive: bool = True) -> dict[str, InstanceView]:
    return {f"req-{i}": InstanceView(request_id=f"req-{i}", alive=is_alive) for i in ids}


def test_missing_workers_are_launched() -> None:
    plan = plan_run(run(desired_workers=3), [worker("a")], alive("a"), [], NOW, POLICY)
    assert plan.launch == 2 and not plan.retire


def test_silent_worker_is_lost_and_replaced_but_not_yet_terminated() -> None:
    silent = worker("a", last_heartbeat_at=NOW - 11)
    plan = plan_run(run(), [silent, worker("b")], alive("a", "b"), [], NOW, POLICY)
    assert "a" in plan.lost and not plan.terminate
    assert plan.launch == 1


def test_vanished_instance_is_lost_without_waiting_for_heartbeat_timeout() -> None:
    instances = {**alive("a", is_alive=False), **alive("b")}
    plan = plan_run(run(), [worker("a"), worker("b")], instances, [], NOW, POLICY)
    assert plan.lost == {"a": "its process or instance is gone"}
    assert plan.launch == 1


def test_worker_that_dies_before_registering_is_a_start_failure() -> None:
    starting = worker("a", WorkerState.launching, registered=False, last_heartbeat_at=None)
    plan = plan_run(run(desired_workers=1), [starting], alive("a", is_alive=False), [], NOW, POLICY)
    assert "a" in plan.failed and plan.start_failures == 1


def test_launch_backs_off_after_failures() -> None:
    r = run(desired_workers=1, consecutive_start_failures=2, last_start_failure_at=NOW - 1)
    plan = plan_run(r, [], {}, [], NOW, POLICY)
    assert plan.launch == 0 and plan.backoff_until == NOW - 1 + POLICY.backoff_s(2)
    later = plan_run(r, [], {}, [], NOW + POLICY.backoff_s(2), POLICY)
    assert later.launch == 1


def test_a_launch_waits_the_first_backoff_after_a_failure_even_when_a_training_worker_ended_the_streak() -> (
    None
):
    # A worker that trains resets the streak (the loop), so a market without capacity would be asked
    # again at every tick while one worker trains: the last failure still holds launches off that long.
    r = run(desired_workers=2, consecutive_start_failures=0, last_start_failure_at=NOW - 1)
    plan = plan_run(r, [worker("a")], alive("a"), [], NOW, POLICY)
    assert plan.launch == 0 and plan.backoff_until == NOW - 1 + POLICY.backoff_s(1)
    later = plan_run(r, [worker("a")], alive("a"), [], NOW - 1 + POLICY.backoff_s(1), POLICY)
    assert later.launch == 1


def test_backoff_is_exponential_and_capped() -> None:
    delays = [POLICY.backoff_s(n) for n in range(1, 12)]
    assert delays[:3] == [2.0, 4.0, 8.0]
    assert max(delays) == POLICY.launch_backoff_cap_s


def test_run_fails_after_repeated_start_failures() -> None:
    starting = worker("a", WorkerState.launching, registered=False)
    failure = FailureView(request_id="req-a", reason="ImportError: no module named nope")
    r = run(desired_workers=1, consecutive_start_failures=2)
    plan = plan_run(r, [starting], alive("a", is_alive=False), [failure], NOW, POLICY)
    assert plan.run_state == (
        RunState.failed,
        "3 workers in a row failed at start-up; the last: worker a: ImportError: no module named nope",
    )
    assert plan.launch == 0


def test_capacity_refusals_never_fail_a_run_and_back_off_together_with_start_failures() -> None:
    starting = worker("a", WorkerState.launching, registered=False)
    refusal = FailureView(request_id="req-a", reason="InsufficientInstanceCapacity", capacity=True)
    r = run(desired_workers=1, consecutive_start_failures=2, capacity_refusals=40)
    plan = plan_run(r, [starting], alive("a", is_alive=False), [refusal], NOW, POLICY)
    assert plan.run_state is None, "a market without capacity is not a broken run"
    assert plan.refused == {"a": "InsufficientInstanceCapacity"} and not plan.failed
    assert plan.start_failures == 0 and plan.launch == 0
    assert plan.backoff_until == NOW + POLICY.backoff_s(43)


def test_after_capacity_refusals_the_next_launch_waits_a_growing_delay() -> None:
    r = run(desired_workers=1, capacity_refusals=3, last_capacity_refusal_at=NOW - 1)
    plan = plan_run(r, [], {}, [], NOW, POLICY)
    assert plan.launch == 0 and plan.backoff_until == NOW - 1 + POLICY.backoff_s(3)
    assert POLICY.backoff_s(3) > POLICY.backoff_s(2)
    later = plan_run(r, [], {}, [], NOW - 1 + POLICY.backoff_s(3), POLICY)
    assert later.launch == 1


def test_a_run_failed_by_start_failures_reported_before_this_tick_names_the_last() -> None:
    # the third failure came as a deregistration (its event), not from the launcher in this tick
    r = run(desired_workers=1, consecutive_start_failures=3, last_start_failure="worker 9: cannot build x:Y")
    plan = plan_run(r, [], {}, [], NOW, POLICY)
    assert plan.run_state == (
        RunState.failed,
        "3 workers in a row failed at start-up; the last: worker 9: cannot build x:Y",
    )


def test_surplus_workers_are_retired_youngest_and_unregistered_first() -> None:
    old = worker("old", created_at=NOW - 500)
    young = worker("young", created_at=NOW - 10)
    starting = worker("starting", WorkerState.launching, registered=False, created_at=NOW - 30)
    plan = plan_run(
        run(desired_workers=1), [old, young, starting], alive("old", "young", "starting"), [], NOW, POLICY
    )
    assert plan.retire == ["starting", "young"]


def test_retired_worker_that_outstays_grace_is_terminated() -> None:
    lingering = worker("a", retire_requested_at=NOW - 6)
    plan = plan_run(run(desired_workers=1), [lingering, worker("b")], alive("a", "b"), [], NOW, POLICY)
    assert plan.exited and "req-a" in plan.terminate and plan.launch == 0


def test_stop_condition_moves_run_to_stopping() -> None:
    plan = plan_run(run(swarm_epoch=10), [worker("a")], alive("a"), [], NOW, POLICY)
    assert plan.run_state == (RunState.stopping, "stop condition reached")
    assert plan.stop_cause == StopCause.target_reached
    assert plan.launch == 0


def test_stopping_run_completes_when_its_workers_have_left() -> None:
    r = run(state=RunState.stopping, swarm_epoch=10, stop_requested_at=NOW - 1)
    assert plan_run(r, [], {}, [], NOW, POLICY).run_state == (RunState.completed, "all workers have left")
    manual = run(state=RunState.stopping, swarm_epoch=3, stop_requested_at=NOW - 1, stop_cause=StopCause.user)
    assert plan_run(manual, [], {}, [], NOW, POLICY).run_state == (RunState.stopped, "all workers have left")


def test_run_stopped_at_its_target_completes_though_the_epoch_read_since_is_lower() -> None:
    """The cause recorded when the loop stopped the run counts, not only the epoch known now."""
    r = run(
        state=RunState.stopping, swarm_epoch=9, stop_requested_at=NOW - 1, stop_cause=StopCause.target_reached
    )
    assert plan_run(r, [], {}, [], NOW, POLICY).run_state == (RunState.completed, "all workers have left")


def test_stopping_run_terminates_workers_after_grace() -> None:
    r = run(state=RunState.stopping, stop_requested_at=NOW - 6)
    plan = plan_run(r, [worker("a")], alive("a"), [], NOW, POLICY)
    assert "req-a" in plan.terminate and plan.run_state is not None


def test_stopping_run_waits_for_graceful_exit_within_grace() -> None:
    r = run(state=RunState.stopping, stop_requested_at=NOW - 1)
    plan = plan_run(r, [worker("a")], alive("a"), [], NOW, POLICY)
    assert plan.is_empty()


def test_intent_without_instance_is_launched_again_idempotently() -> None:
    intent = worker("a", WorkerState.launching, registered=False, created_at=NOW - 5)
    plan = plan_run(run(desired_workers=1), [intent], {}, [], NOW, POLICY)
    assert plan.relaunch == ["req-a"] and plan.launch == 0


def test_launching_worker_that_never_registers_times_out() -> None:
    stuck = worker("a", WorkerState.launching, registered=False, created_at=NOW - 61)
    plan = plan_run(run(desired_workers=1), [stuck], alive("a"), [], NOW, POLICY)
    assert "a" in plan.failed and "req-a" in plan.terminate


def test_registered_worker_whose_process_failed_is_lost_not_a_start_failure() -> None:
    failure = FailureView(request_id="req-a", reason="exit code -9")
    plan = plan_run(run(), [worker("a"), worker("b")], alive("b"), [failure], NOW, POLICY)
    assert plan.lost == {"a": "ended without leaving: exit code -9"}
    assert not plan.failed and plan.start_failures == 0 and plan.launch == 1


def test_a_worker_with_a_spot_notice_is_replaced_while_it_trains_and_never_retired() -> None:
    noticed = worker("a", leaving=True)
    plan = plan_run(run(desired_workers=1), [noticed], alive("a"), [], NOW, POLICY)
    assert plan.launch == 1 and not plan.retire and not plan.terminate

    replacement = worker("b", WorkerState.launching, registered=False, created_at=NOW - 1)
    plan = plan_run(run(desired_workers=1), [noticed, replacement], alive("a", "b"), [], NOW, POLICY)
    assert plan.is_empty(), "the replacement counts; the noticed worker is neither retired nor replaced twice"


def test_missing_peers_launch_on_whole_machines_and_the_last_holds_only_what_is_missing() -> None:
    plan = plan_run(run(desired_workers=7, peers_per_machine=2), [worker("a")], alive("a"), [], NOW, POLICY)
    assert plan.machines == [2, 2, 2] and plan.launch == 6

    one_short = plan_run(
        run(desired_workers=2, peers_per_machine=4), [worker("a")], alive("a"), [], NOW, POLICY
    )
    assert one_short.machines == [1], "k = min(peers per machine, peers still missing)"


def test_peers_of_a_machine_still_starting_count_so_nothing_more_is_launched() -> None:
    starting = [
        worker(w, WorkerState.launching, registered=False, last_heartbeat_at=None, created_at=NOW - 5)
        for w in ("a", "b")
    ]
    plan = plan_run(run(desired_workers=2, peers_per_machine=2), starting, alive("a", "b"), [], NOW, POLICY)
    assert plan.launch == 0 and plan.machines == [] and plan.is_empty()


def test_a_tick_launches_at_most_its_cap_of_peers_but_always_one_whole_machine() -> None:
    many = plan_run(run(desired_workers=40, peers_per_machine=8), [], {}, [], NOW, POLICY)
    assert many.machines == [8, 8] and many.launch == 16
    huge = plan_run(run(desired_workers=40, peers_per_machine=32), [], {}, [], NOW, POLICY)
    assert huge.machines == [32]


def test_a_reclaimed_machine_is_replaced_by_one_machine_while_its_peers_still_train() -> None:
    leaving = [worker(w, leaving=True) for w in ("a", "b")]
    plan = plan_run(run(desired_workers=2, peers_per_machine=2), leaving, alive("a", "b"), [], NOW, POLICY)
    assert plan.machines == [2] and not plan.retire and not plan.terminate


def test_one_machine_per_peer_by_default() -> None:
    plan = plan_run(run(desired_workers=3), [], {}, [], NOW, POLICY)
    assert plan.machines == [1, 1, 1] and plan.launch == 3


def test_a_scale_down_empties_machines_before_it_thins_out_full_ones() -> None:
    full = [worker(w, machine="m1", created_at=NOW - 20) for w in ("a", "b", "c", "d")]
    thin = [worker(w, machine="m2", created_at=NOW - 30) for w in ("e", "f")]  # older, yet fewer peers
    plan = plan_run(run(desired_workers=4), full + thin, alive(*"abcdef"), [], NOW, POLICY)
    assert sorted(plan.retire) == ["e", "f"], "the machine of two goes whole; the four-GPU one stays full"


def test_a_machine_whose_peers_all_fail_at_start_is_one_failed_launch() -> None:
    peers = [worker(w, WorkerState.launching, registered=False, machine="req-a") for w in "abcd"]
    failures = [FailureView(request_id=f"req-{w}", reason="docker pull failed") for w in "abcd"]
    r = run(desired_workers=4, peers_per_machine=4, consecutive_start_failures=1)
    plan = plan_run(r, peers, alive(*"abcd", is_alive=False), failures, NOW, POLICY)
    assert len(plan.failed) == 4 and plan.start_failures == 1
    assert plan.run_state is None, "two failed machines of a budget of three: the run goes on"
    assert plan.backoff_until == NOW + POLICY.backoff_s(2)

    third = plan_run(run(desired_workers=4, peers_per_machine=4, consecutive_start_failures=2), peers,
                     alive(*"abcd", is_alive=False), failures, NOW, POLICY)  # fmt: skip
    assert third.run_state is not None and third.run_state[1].startswith("3 machines in a row failed")


def test_a_machine_the_market_refused_is_one_refusal() -> None:
    peers = [worker(w, WorkerState.launching, registered=False, machine="req-a") for w in "ab"]
    refusals = [FailureView(request_id=f"req-{w}", reason="no capacity", capacity=True) for w in "ab"]
    plan = plan_run(run(peers_per_machine=2), peers, {}, refusals, NOW, POLICY)
    assert len(plan.refused) == 2 and plan.refused_launches == 1
    assert plan.backoff_until == NOW + POLICY.backoff_s(1)
