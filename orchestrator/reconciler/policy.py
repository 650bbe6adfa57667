"""What the reconcile loop decides for one run in one tick, as a pure function of what it observed.

The loop (``orchestrator/reconciler/loop.py``) gathers views of the database rows and of the launcher's
instances, calls :func:`plan_run`, and carries the plan out through ``orchestrator/domain/runs.py`` and the
launcher. Keeping the decision pure makes every rule testable without processes or a database.

Order of a tick, as in Ray's autoscaler and SkyPilot's recovery loop: first the passive transitions
(what the world reports: a failed launch, a silent worker, a vanished instance), then the actions
(launch, retire, finish the run).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from orchestrator.domain.states import ACCEPTING_RUN_STATES, LIVE_WORKER_STATES, StopCause, settled_state
from worker.wire import RunState, StopCondition, WorkerState

# The reason (for people) a run goes to ``stopping`` when its target is met; its stop cause is
# ``target_reached``, so it ends ``completed``.
STOP_CONDITION_REACHED = "stop condition reached"


@dataclass(frozen=True)
class ReconcilePolicy:
    """Timeouts and limits of the loop. Every duration is in seconds."""

    heartbeat_timeout_s: float = 30.0
    launch_timeout_s: float = 180.0  # launching -> failed when the worker never registers
    retire_grace_s: float = 30.0  # a retired or stopping worker may finish its last step this long
    backoff_base_s: float = 2.0
    backoff_cap_s: float = 120.0
    max_start_failures: int = 5  # consecutive start-up failures before the run is failed
    max_launches_per_tick: int = 16

    def backoff_s(self, consecutive_failures: int) -> float:
        """Delay before the next launch after ``consecutive_failures`` start-up failures in a row."""
        if consecutive_failures <= 0:
            return 0.0
        return float(min(self.backoff_cap_s, self.backoff_base_s * 2 ** (consecutive_failures - 1)))


@dataclass(frozen=True)
class WorkerView:
    """The parts of a worker row the loop decides on."""

    id: str
    request_id: str
    state: WorkerState
    created_at: float
    registered: bool  # it reached the orchestrator at least once
    last_heartbeat_at: float | None = None
    retire_requested_at: float | None = None


@dataclass(frozen=True)
class InstanceView:
    """A launcher's instance, reduced to what the loop needs."""

    request_id: str
    alive: bool


@dataclass(frozen=True)
class FailureView:
    request_id: str
    reason: str
    retryable: bool = True


@dataclass(frozen=True)
class RunView:
    """The parts of a run row the loop decides on."""

    name: str
    state: RunState
    desired_workers: int
    stop: StopCondition
    target_batch_size: int = 1
    swarm_epoch: int = 0
    consecutive_start_failures: int = 0
    last_start_failure_at: float | None = None
    stop_requested_at: float | None = None
    stop_cause: StopCause | None = None


@dataclass
class Plan:
    """What to do for one run. Worker ids map to the reason written into the run's events."""

    lost: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    exited: dict[str, str] = field(default_factory=dict)
    start_failures: int = 0  # how many of ``failed`` never reached the orchestrator
    launch: int = 0
    relaunch: list[str] = field(default_factory=list)  # request ids written but never launched
    retire: list[str] = field(default_factory=list)  # worker ids asked to leave gracefully
    terminate: list[str] = field(default_factory=list)  # request ids to stop through the launcher
    run_state: tuple[RunState, str] | None = None
    stop_cause: StopCause = StopCause.user  # why, when ``run_state`` is stopping
    backoff_until: float | None = None

    def is_empty(self) -> bool:
        return not (
            self.lost
            or self.failed
            or self.exited
            or self.launch
            or self.relaunch
            or self.retire
            or self.terminate
            or self.run_state
        )


def stop_condition_reached(run: RunView) -> bool:
    """True when the swarm reached the run's target epochs or samples (``RunView.swarm_epoch`` comes
    from ``runs.swarm_epoch``: what the DHT showed, not what workers said)."""
    return run.stop.reached(run.swarm_epoch, run.target_batch_size)


def plan_run(
    run: RunView,
    workers: Iterable[WorkerView],
    instances: Mapping[str, InstanceView],
    failures: Iterable[FailureView],
    now: float,
    policy: ReconcilePolicy,
) -> Plan:
    """Decide one tick for ``run``. ``instances`` is keyed by request id; ``failures`` are new ones."""
    plan = Plan()
    live = [w for w in workers if w.state in LIVE_WORKER_STATES]
    failure_by_request = {f.request_id: f for f in failures}
    survivors = _passive_transitions(live, instances, failure_by_request, now, policy, plan)
    if run.state == RunState.stopping:
        _wind_down(run, survivors, now, policy, plan)
    elif run.state in ACCEPTING_RUN_STATES:
        _keep_at_desired(run, survivors, instances, now, policy, plan)
    return plan


def _passive_transitions(
    live: list[WorkerView],
    instances: Mapping[str, InstanceView],
    failures: Mapping[str, FailureView],
    now: float,
    policy: ReconcilePolicy,
    plan: Plan,
) -> list[WorkerView]:
    """Record what the world reports; return the workers that are still live afterwards."""
    survivors: list[WorkerView] = []
    for worker in live:
        instance = instances.get(worker.request_id)
        failure = failures.get(worker.request_id)
        if failure is not None and worker.registered:
            # It trained, then its process or machine ended without deregistering: lost, not failed.
            plan.lost[worker.id] = f"ended without leaving: {failure.reason.split('; log:')[0][:300]}"
        elif failure is not None:
            plan.failed[worker.id] = failure.reason
            plan.start_failures += 1
        elif worker.state == WorkerState.launching and instance is not None and not instance.alive:
            plan.failed[worker.id] = "worker process ended before it registered"
            plan.start_failures += 1
        elif worker.state == WorkerState.launching and now - worker.created_at > policy.launch_timeout_s:
            plan.failed[worker.id] = f"did not register within {policy.launch_timeout_s:.0f} s"
            plan.start_failures += 1
            plan.terminate.append(worker.request_id)
        elif worker.state == WorkerState.running and instance is not None and not instance.alive:
            plan.lost[worker.id] = "its process or instance is gone"
        elif worker.state == WorkerState.running and _silent(worker, now, policy):
            # Not terminated yet: a worker that was only slow comes back as running (and the surplus is
            # retired, youngest first). The loop terminates it if it stays silent (see the reconciler).
            plan.lost[worker.id] = f"no heartbeat for {policy.heartbeat_timeout_s:.0f} s"
        else:
            if worker.state == WorkerState.launching and instance is None:
                plan.relaunch.append(worker.request_id)  # intent written, launch never happened
            survivors.append(worker)
    return survivors


def _silent(worker: WorkerView, now: float, policy: ReconcilePolicy) -> bool:
    last = worker.last_heartbeat_at if worker.last_heartbeat_at is not None else worker.created_at
    return now - last > policy.heartbeat_timeout_s


def _wind_down(
    run: RunView, survivors: list[WorkerView], now: float, policy: ReconcilePolicy, plan: Plan
) -> None:
    """A stopping run: workers were told to leave; force the ones that outstay the grace period."""
    started = run.stop_requested_at if run.stop_requested_at is not None else now
    overdue = now - started > policy.retire_grace_s
    remaining = []
    for worker in survivors:
        if overdue or not worker.registered:
            plan.exited[worker.id] = "terminated: the run is stopping"
            plan.terminate.append(worker.request_id)
        else:
            remaining.append(worker)
    if not remaining:
        plan.run_state = (settled_state(run.stop_cause, stop_condition_reached(run)), "all workers have left")


def _keep_at_desired(
    run: RunView,
    survivors: list[WorkerView],
    instances: Mapping[str, InstanceView],
    now: float,
    policy: ReconcilePolicy,
    plan: Plan,
) -> None:
    """A running run: finish it, fail it, or launch and retire workers to meet the desired count."""
    if stop_condition_reached(run):
        plan.run_state = (RunState.stopping, STOP_CONDITION_REACHED)
        plan.stop_cause = StopCause.target_reached
        return
    # The streak is reset when a worker registers (domain/runs.py); failures of this tick extend it.
    streak = run.consecutive_start_failures + plan.start_failures
    if streak >= policy.max_start_failures:
        plan.run_state = (RunState.failed, f"{streak} workers in a row failed at start-up")
        plan.terminate.extend(w.request_id for w in survivors)
        plan.exited.update({w.id: "terminated: the run failed" for w in survivors})
        return
    retiring = [w for w in survivors if w.retire_requested_at is not None]
    for worker in retiring:
        if now - worker.retire_requested_at > policy.retire_grace_s:  # type: ignore[operator]
            plan.exited[worker.id] = "terminated: retired by scale-down"
            plan.terminate.append(worker.request_id)
    active = [w for w in survivors if w.retire_requested_at is None]
    surplus = len(active) - run.desired_workers
    if surplus > 0:
        plan.retire = [w.id for w in _retire_order(active)[:surplus]]
        return
    missing = -surplus
    if missing > 0:
        last_failure = run.last_start_failure_at if plan.start_failures == 0 else now
        wait_until = (last_failure or 0.0) + policy.backoff_s(streak)
        if now < wait_until:
            plan.backoff_until = wait_until
        else:
            plan.launch = min(missing, policy.max_launches_per_tick)


def _retire_order(workers: list[WorkerView]) -> list[WorkerView]:
    """Retire workers still starting first, then the youngest: the oldest hold the most state."""
    return sorted(workers, key=lambda w: (w.registered, -w.created_at))
