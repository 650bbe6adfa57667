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

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.domain.states import ACCEPTING_RUN_STATES, LIVE_WORKER_STATES, StopCause, settled_state
from worker.protocol.runs import RunState, StopCondition
from worker.protocol.workers import WorkerState

# The reason (for people) a run goes to ``stopping`` when its target is met; its stop cause is
# ``target_reached``, so it ends ``completed``.
STOP_CONDITION_REACHED = "stop condition reached"
MAX_LAUNCHES_PER_TICK = 16  # peers per run: a large scale-up reaches its count over a few ticks


class ReconcileSettings(BaseModel):
    """The loop's timeouts and limits: ``Settings.reconciler``, and what :func:`plan_run` decides by.

    Declared here, beside the rules that use them, so that the policy needs nothing of the server; the
    orchestrator's settings nest this model. Each field is read from ``SPOTSWARM_<NAME>`` and
    ``--<name>`` of ``spotswarm serve``, where the name is its alias or else its own name
    (``enabled``: ``SPOTSWARM_RECONCILE``). Every duration is in seconds.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", validate_by_name=True, validate_by_alias=True)

    enabled: bool = Field(
        default=True,
        validation_alias="reconcile",
        description="Run the reconcile loop that launches and replaces workers.",
    )
    interval_s: float = Field(
        default=2.0,
        gt=0,
        le=600,
        validation_alias="reconcile_interval_s",
        description="Seconds between reconcile ticks.",
    )
    heartbeat_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=86400,
        description="A worker silent this long is no longer counted live.",
    )
    manual_lost_end_s: float = Field(
        default=300.0,
        gt=0,
        le=30 * 86400,
        description="A worker joined by hand that stays silent this long has ended: its worker token stops "
        "working (checkpoint downloads, re-registration), and it must join again with the join token.",
    )
    launch_timeout_s: float = Field(
        default=180.0,
        gt=0,
        le=86400,
        description="A launched worker that has not registered by then has failed.",
    )
    retire_grace_s: float = Field(
        default=30.0, ge=0, le=3600, description="Seconds a worker told to leave has before it is terminated."
    )
    launch_backoff_base_s: float = Field(
        default=2.0, gt=0, le=3600, description="First delay after a start-up failure; doubles per failure."
    )
    launch_backoff_cap_s: float = Field(
        default=120.0, gt=0, le=86400, description="Longest delay between launches after start-up failures."
    )
    max_start_failures: int = Field(
        default=5,
        ge=1,
        le=1000,
        description="Start-up failures in a row after which a run is marked failed. Launches a market "
        "refused for capacity never count: the run waits for capacity, asked ever less often.",
    )

    def backoff_s(self, consecutive_failures: int) -> float:
        """Delay before the next launch after ``consecutive_failures`` start-up failures in a row."""
        if consecutive_failures <= 0:
            return 0.0
        return float(
            min(self.launch_backoff_cap_s, self.launch_backoff_base_s * 2 ** (consecutive_failures - 1))
        )


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
    leaving: bool = False  # a spot notice: it trains on until it leaves, but no longer counts as desired
    machine: str | None = None  # the machine it shares with other peers (its first peer's request id)


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
    capacity: bool = False  # the market had no machine: back off, never fail the run


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
    last_start_failure: str | None = None  # its event's message ("worker 7: ..."), when there is a streak
    capacity_refusals: int = 0  # launches the market refused in a row (no capacity), since one succeeded
    last_capacity_refusal_at: float | None = None
    stop_requested_at: float | None = None
    stop_cause: StopCause | None = None
    peers_per_machine: int = 1  # peers one machine of its launcher runs (one per device)


@dataclass
class Plan:
    """What to do for one run. Worker ids map to the reason written into the run's events."""

    lost: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # never started: the market had no capacity
    exited: dict[str, str] = field(default_factory=dict)
    start_failures: int = 0  # launches (machines) of ``failed`` whose workers never reached the orchestrator
    refused_launches: int = 0  # launches (machines) of ``refused``
    launch: int = 0  # peers to start, on ``machines``
    machines: list[int] = field(default_factory=list)  # peers of each machine to start
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
            or self.refused
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
    settings: ReconcileSettings,
) -> Plan:
    """Decide one tick for ``run``. ``instances`` is keyed by request id; ``failures`` are new ones."""
    plan = Plan()
    live = [w for w in workers if w.state in LIVE_WORKER_STATES]
    failure_by_request = {f.request_id: f for f in failures}
    survivors = _passive_transitions(live, instances, failure_by_request, now, settings, plan)
    if run.state == RunState.stopping:
        _wind_down(run, survivors, now, settings, plan)
    elif run.state in ACCEPTING_RUN_STATES:
        _keep_at_desired(run, survivors, now, settings, plan)
    return plan


def _passive_transitions(
    live: list[WorkerView],
    instances: Mapping[str, InstanceView],
    failures: Mapping[str, FailureView],
    now: float,
    settings: ReconcileSettings,
    plan: Plan,
) -> list[WorkerView]:
    """Record what the world reports; return the workers that are still live afterwards."""
    survivors: list[WorkerView] = []
    failed_launches: set[str] = set()  # a machine's peers failing together are one failed launch
    refused_launches: set[str] = set()
    for worker in live:
        instance = instances.get(worker.request_id)
        failure = failures.get(worker.request_id)
        if failure is not None and worker.registered:
            # It trained, then its process or machine ended without deregistering: lost, not failed.
            plan.lost[worker.id] = f"ended without leaving: {failure.reason.split('; log:')[0][:300]}"
        elif failure is not None and failure.capacity:
            plan.refused[worker.id] = failure.reason
            refused_launches.add(worker.machine or worker.id)
        elif failure is not None:
            plan.failed[worker.id] = failure.reason
            failed_launches.add(worker.machine or worker.id)
        elif worker.state == WorkerState.launching and instance is not None and not instance.alive:
            plan.failed[worker.id] = "worker process ended before it registered"
            failed_launches.add(worker.machine or worker.id)
        elif worker.state == WorkerState.launching and now - worker.created_at > settings.launch_timeout_s:
            plan.failed[worker.id] = f"did not register within {settings.launch_timeout_s:.0f} s"
            failed_launches.add(worker.machine or worker.id)
            plan.terminate.append(worker.request_id)
        elif worker.state == WorkerState.running and instance is not None and not instance.alive:
            plan.lost[worker.id] = "its process or instance is gone"
        elif worker.state == WorkerState.running and _silent(worker, now, settings):
            # Not terminated yet: a worker that was only slow comes back as running (and the surplus is
            # retired, youngest first). The loop terminates it if it stays silent (see the reconciler).
            plan.lost[worker.id] = f"no heartbeat for {settings.heartbeat_timeout_s:.0f} s"
        else:
            if worker.state == WorkerState.launching and instance is None:
                plan.relaunch.append(worker.request_id)  # intent written, launch never happened
            survivors.append(worker)
    plan.start_failures, plan.refused_launches = len(failed_launches), len(refused_launches)
    return survivors


def _silent(worker: WorkerView, now: float, settings: ReconcileSettings) -> bool:
    last = worker.last_heartbeat_at if worker.last_heartbeat_at is not None else worker.created_at
    return now - last > settings.heartbeat_timeout_s


def _wind_down(
    run: RunView, survivors: list[WorkerView], now: float, settings: ReconcileSettings, plan: Plan
) -> None:
    """A stopping run: workers were told to leave; force the ones that outstay the grace period."""
    started = run.stop_requested_at if run.stop_requested_at is not None else now
    overdue = now - started > settings.retire_grace_s
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
    now: float,
    settings: ReconcileSettings,
    plan: Plan,
) -> None:
    """A running run: finish it, fail it, or launch and retire workers to meet the desired count."""
    if stop_condition_reached(run):
        plan.run_state = (RunState.stopping, STOP_CONDITION_REACHED)
        plan.stop_cause = StopCause.target_reached
        return
    # The streak is reset when a worker registers (domain/runs.py); failures of this tick extend it.
    streak = run.consecutive_start_failures + plan.start_failures
    if streak >= settings.max_start_failures:
        plan.run_state = (RunState.failed, _start_failures_reason(streak, run, plan))
        plan.terminate.extend(w.request_id for w in survivors)
        plan.exited.update({w.id: "terminated: the run failed" for w in survivors})
        return
    retiring = [w for w in survivors if w.retire_requested_at is not None]
    for worker in retiring:
        if now - worker.retire_requested_at > settings.retire_grace_s:  # type: ignore[operator]
            plan.exited[worker.id] = "terminated: retired by scale-down"
            plan.terminate.append(worker.request_id)
    # A worker with a spot notice is replaced now, while it still trains (the market bounds the launch).
    active = [w for w in survivors if w.retire_requested_at is None and not w.leaving]
    surplus = len(active) - run.desired_workers
    if surplus > 0:
        plan.retire = [w.id for w in _retire_order(active)[:surplus]]
        return
    missing = -surplus
    if missing > 0:
        wait_until = _backoff_until(run, streak, now, settings, plan)
        if now < wait_until:
            plan.backoff_until = wait_until
        else:
            plan.machines = machine_sizes(missing, run.peers_per_machine)
            plan.launch = sum(plan.machines)


def machine_sizes(missing: int, peers_per_machine: int) -> list[int]:
    """The machines that start ``missing`` peers this tick: full ones of ``peers_per_machine``, the last
    holding what is left over (never a peer more than missing). At most :data:`MAX_LAUNCHES_PER_TICK`
    peers a tick, but always one whole machine: a large scale-up reaches its count over a few ticks."""
    per_machine = max(1, peers_per_machine)
    budget = min(missing, max(MAX_LAUNCHES_PER_TICK, per_machine))
    full, rest = divmod(budget, per_machine)
    return [per_machine] * full + ([rest] if rest else [])


def _backoff_until(run: RunView, streak: int, now: float, settings: ReconcileSettings, plan: Plan) -> float:
    """When the next launch may go: the back-off grows with start-up failures and capacity refusals
    together, so a market without capacity is asked ever less often (up to the cap), though only
    start-up failures fail the run. At least the first delay after any failure: a training worker ends
    the start-up streak (the loop), and a market without capacity would otherwise be asked again at
    every tick while one worker trains."""
    refusals = run.capacity_refusals + plan.refused_launches
    if plan.start_failures or plan.refused:
        last_failure: float | None = now
    else:
        known = [t for t in (run.last_start_failure_at, run.last_capacity_refusal_at) if t is not None]
        last_failure = max(known) if known else None
    if last_failure is None:
        return 0.0
    return last_failure + settings.backoff_s(max(streak + refusals, 1))


def _start_failures_reason(streak: int, run: RunView, plan: Plan) -> str:
    """Why a run fails after ``streak`` start-up failures (launches: workers, or machines of several),
    naming the last one's cause: a run's state that says only how many failed sends its reader to the
    events."""
    failed_now = [f"worker {worker_id}: {reason}" for worker_id, reason in plan.failed.items()]
    last = failed_now[-1] if failed_now else run.last_start_failure
    launches = "machines" if run.peers_per_machine > 1 else "workers"
    reason = f"{streak} {launches} in a row failed at start-up"
    return f"{reason}; the last: {last}" if last else reason


def _retire_order(workers: list[WorkerView]) -> list[WorkerView]:
    """Retire workers still starting first, then those on the machines with the fewest active peers (so
    that a scale-down empties machines rather than leaving devices idle on many), then the youngest: the
    oldest hold the most state."""
    peers: dict[str, int] = {}
    for worker in workers:
        if worker.machine is not None:
            peers[worker.machine] = peers.get(worker.machine, 0) + 1

    def on_machine(worker: WorkerView) -> int:
        return peers[worker.machine] if worker.machine is not None else 1

    return sorted(workers, key=lambda w: (w.registered, on_machine(w), -w.created_at))
