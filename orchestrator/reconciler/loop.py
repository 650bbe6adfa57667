"""The reconcile loop: keeps every active run at its desired worker count through its launcher.

Each tick has three steps:

1. **observe** what the launchers report (instances alive or gone, failures since the last poll);
2. **decide and record**, in one database transaction: for each active run, build views of its rows,
   ask :func:`orchestrator.reconciler.policy.plan_run` what to do, and write the outcome through
   ``orchestrator/domain/runs.py`` and ``orchestrator/domain/workers.py``: state changes, events, and the
   ``launching`` rows of new workers (the intent is committed *before* any launch);
3. **act** through the launchers after the commit: launch the committed intents, terminate what the
   plan retired. A crash between 2 and 3 leaves ``launching`` rows with no instance; the next
   orchestrator process launches those once (launchers are idempotent by request id).

The loop never raises into its caller: a failed tick is logged and counted, and the next tick tries
again. Launcher calls block (boto3, process spawning), so the service that runs the loop
(``orchestrator/reconciler/service.py``) runs ticks in a worker thread and the API's event loop never
waits on them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from orchestrator.clock import Clock
from orchestrator.db.models import Run, Worker
from orchestrator.db.session import Database
from orchestrator.domain import events, runs, workers
from orchestrator.domain.states import ACCEPTING_RUN_STATES, LIVE_WORKER_STATES
from orchestrator.errors import IllegalTransition, ServiceError
from orchestrator.launchers.base import (
    MACHINE_DETAIL,
    PEER_INDEX_DETAIL,
    Instance,
    Launcher,
    LauncherConfigError,
    LaunchFailure,
    LaunchRequest,
    PeerRequest,
)
from orchestrator.reconciler.policy import (
    FailureView,
    InstanceView,
    Plan,
    ReconcileSettings,
    RunView,
    WorkerView,
    plan_run,
)
from worker.protocol.runs import RunState
from worker.protocol.workers import LEAVING_PHASE, WorkerState

logger = logging.getLogger(__name__)

SwarmEpochReader = Callable[[str], "int | None"]


@dataclass
class _Actions:
    """Launcher calls to make after the tick's transaction has committed."""

    launches: list[tuple[str, LaunchRequest]] = field(default_factory=list)  # (launcher name, request)
    terminations: list[tuple[str, str]] = field(default_factory=list)  # (launcher name, request id)


@dataclass(frozen=True)
class TickStats:
    """What one tick did (for logs, metrics and tests)."""

    duration_s: float
    launched: int
    terminated: int
    error: str | None = None


class Reconciler:
    """Drives workers of every active run towards its desired count. See the module docstring."""

    def __init__(
        self,
        db: Database,
        launchers: Mapping[str, Launcher],
        api_url: str,
        settings: ReconcileSettings,
        clock: Clock,
        swarm_epoch: SwarmEpochReader | None = None,
    ) -> None:
        self.db = db
        self.launchers = dict(launchers)
        self.api_url = api_url
        self.settings = settings
        self.clock = clock
        self.swarm_epoch = swarm_epoch or (lambda _swarm_id: None)
        self.started_at = clock()
        self.ticks = 0
        self.errors = 0
        self.busy_s = 0.0  # seconds spent in ticks, all together (the metrics' duty cycle)
        self.last_tick: TickStats | None = None
        self._orphans_terminated: set[str] = set()
        # run name -> (launches the market refused in a row, when the last was): pacing, not run state, so
        # kept here; a restarted orchestrator asks again from the first delay
        self._capacity_refusals: dict[str, tuple[int, datetime]] = {}
        self.last_tick_at: datetime | None = None

    # -- the loop ------------------------------------------------------------------------------------

    def tick(self) -> TickStats:
        """One observe-decide-act round; failures are logged and returned, never raised."""
        stats = self._tick_once()
        self.last_tick, self.last_tick_at = stats, self.clock()
        self.busy_s += stats.duration_s
        return stats

    def _tick_once(self) -> TickStats:
        started = time.monotonic()
        self.ticks += 1
        try:
            instances, failures = self._observe()
            actions = self._decide(instances, failures)
            launched = self._launch(actions.launches)
            for launcher_name, request_id in actions.terminations:
                self.launchers[launcher_name].terminate(request_id)
        except (SQLAlchemyError, OSError, ServiceError) as exc:
            self.errors += 1
            logger.warning("reconcile tick failed: %s", exc)
            return TickStats(time.monotonic() - started, 0, 0, error=str(exc))
        return TickStats(time.monotonic() - started, launched, len(actions.terminations))

    # -- 1. observe ----------------------------------------------------------------------------------

    def _observe(self) -> tuple[dict[str, tuple[str, Instance]], dict[str, LaunchFailure]]:
        instances: dict[str, tuple[str, Instance]] = {}
        failures: dict[str, LaunchFailure] = {}
        for name, launcher in self.launchers.items():
            for instance in launcher.describe():
                instances[instance.request_id] = (name, instance)
            for failure in launcher.poll_errors():
                failures[failure.request_id] = failure
        return instances, failures

    # -- 2. decide and record ------------------------------------------------------------------------

    def _decide(
        self, instances: dict[str, tuple[str, Instance]], failures: dict[str, LaunchFailure]
    ) -> _Actions:
        actions = _Actions()
        now = self.clock()
        with self.db.begin() as session:
            for run in runs.list_active_runs(session):
                self._reconcile_run(session, run, instances, failures, now, actions)
            self._terminate_orphans(session, instances, actions, now)
        return actions

    def _reconcile_run(
        self,
        session: Session,
        run: Run,
        instances: dict[str, tuple[str, Instance]],
        failures: dict[str, LaunchFailure],
        now: datetime,
        actions: _Actions,
    ) -> None:
        launcher = self.launchers.get(run.launcher)
        if launcher is None:
            self._fail_run(session, run, f"unknown launcher {run.launcher!r}", now)
            return
        # Workers joined by hand count, but are not managed: only the silent ones are loaded (there may be
        # thousands; loading them all each tick held SQLite's write lock for seconds under load).
        self._expire_manual_workers(session, run, now)
        rows = list(runs.live_workers(session, run.id, manual=False))
        plan = plan_run(
            self._run_view(session, run, launcher),
            [_worker_view(w, self.started_at) for w in rows],
            {
                rid: InstanceView(rid, inst.alive)
                for rid, (name, inst) in instances.items()
                if name == run.launcher
            },
            [_failure_view(failures[w.request_id]) for w in rows if w.request_id in failures],
            now.timestamp(),
            self.settings,
        )
        _copy_launch_details(rows, instances)
        if run.consecutive_start_failures and any(w.samples > 0 for w in rows):
            run.consecutive_start_failures = 0  # a worker trains: the start-up failure streak is over
        if plan.is_empty():
            return
        by_id = {str(w.id): w for w in rows}
        self._record_plan(session, run, plan, by_id, now)
        actions.terminations.extend((run.launcher, rid) for rid in plan.terminate)
        if run.state in ACCEPTING_RUN_STATES:
            actions.launches.extend(self._intents(session, run, plan, by_id, now))

    def _expire_manual_workers(self, session: Session, run: Run, now: datetime) -> None:
        """A worker started by hand has no launcher to ask: only its heartbeats say it is alive. Silent past
        the heartbeat timeout it is lost; silent past ``manual_lost_end_s`` it has ended.

        Silence counts from the loop's start at the earliest (workers could not reach a stopped one).
        """
        cutoff = now - timedelta(seconds=self.settings.heartbeat_timeout_s)
        if self.started_at >= cutoff:
            return
        for worker in runs.live_workers(session, run.id, manual=True, silent_before=cutoff):
            reason = f"no heartbeat for {self.settings.heartbeat_timeout_s:.0f} s"
            self._set_worker(session, worker, WorkerState.lost, reason, now)
        # Lost for good: its token would otherwise work (checkpoints, secrets at re-registration) while
        # the run lives, even after the join token that made it was replaced.
        end_s = self.settings.manual_lost_end_s
        ended_cutoff = now - timedelta(seconds=end_s)
        if self.started_at >= ended_cutoff:
            return
        for worker in runs.unended_manual_workers(session, run.id, silent_before=ended_cutoff):
            reason = f"silent for {end_s:.0f} s: ended (its worker token no longer works; join again)"
            self._set_worker(session, worker, WorkerState.exited, reason, now)

    def _run_view(self, session: Session, run: Run, launcher: Launcher) -> RunView:
        refusals, last_refusal = self._capacity_refusals.get(run.name, (0, None))
        try:
            peers_per_machine = launcher.peers_per_machine(run.launcher_options)
        except LauncherConfigError:
            peers_per_machine = 1  # its launches are refused, one peer at a time, with the reason
        return RunView(
            name=run.name,
            state=run.state,
            desired_workers=run.desired_workers,
            stop=runs.stop_condition(run),
            target_batch_size=run.target_batch_size,
            swarm_epoch=runs.swarm_epoch(run, self.swarm_epoch(run.swarm_id)),
            consecutive_start_failures=run.consecutive_start_failures,
            last_start_failure_at=_ts(run.last_start_failure_at),
            last_start_failure=events.last_message(session, run.id, "run.start_failure")
            if run.consecutive_start_failures
            else None,
            stop_requested_at=_ts(run.stop_requested_at),
            stop_cause=run.stop_cause,
            capacity_refusals=refusals,
            last_capacity_refusal_at=_ts(last_refusal),
            peers_per_machine=peers_per_machine,
        )

    def _record_plan(
        self, session: Session, run: Run, plan: Plan, by_id: dict[str, Worker], now: datetime
    ) -> None:
        """Write the passive transitions, retirements and the run's new state."""
        failed_launches: set[str] = set()  # a machine's peers failing together are one failed launch
        for worker_id, reason in plan.failed.items():
            worker = by_id[worker_id]
            launch = _machine_of(worker) or worker.request_id
            if worker.registered_at is None and launch not in failed_launches:
                failed_launches.add(launch)
                workers.record_start_failure(session, run, f"worker {worker.id}: {reason}", now)
            self._set_worker(session, worker, WorkerState.failed, reason, now)
        for worker_id, reason in plan.refused.items():
            worker = by_id[worker_id]
            events.record_event(session, run.id, "run.no_capacity", f"worker {worker.id}: {reason}", now)
            self._set_worker(session, worker, WorkerState.failed, reason, now)
        if plan.refused:
            refusals, _ = self._capacity_refusals.get(run.name, (0, now))
            self._capacity_refusals[run.name] = (refusals + plan.refused_launches, now)
        for worker_id, reason in plan.lost.items():
            self._set_worker(session, by_id[worker_id], WorkerState.lost, reason, now)
        for worker_id, reason in plan.exited.items():
            self._set_worker(session, by_id[worker_id], WorkerState.exited, reason, now)
        for worker_id in plan.retire:
            workers.request_retire(session, by_id[worker_id], "scaled down", now)
        if plan.backoff_until is not None:
            logger.debug("run %s: launches back off until %.0f", run.name, plan.backoff_until)
        if plan.run_state is not None:
            state, reason = plan.run_state
            try:
                if state == RunState.stopping:
                    runs.stop_run(session, run, reason, now, plan.stop_cause)
                else:
                    runs.set_run_state(session, run, state, reason, now)
            except IllegalTransition as exc:  # the API changed the run meanwhile; next tick decides again
                logger.info("run %s: %s", run.name, exc)

    def _set_worker(
        self, session: Session, worker: Worker, state: WorkerState, reason: str, now: datetime
    ) -> None:
        try:
            runs.set_worker_state(session, worker, state, reason, now)
        except IllegalTransition as exc:
            logger.info("run %s worker %s: %s", worker.run.name, worker.id, exc)

    def _intents(
        self, session: Session, run: Run, plan: Plan, by_id: dict[str, Worker], now: datetime
    ) -> list[tuple[str, LaunchRequest]]:
        """Write the ``launching`` rows of new workers, a machine's peers together (and re-arm rows an
        earlier process never launched, each machine as it was written)."""
        requests: list[tuple[str, LaunchRequest]] = []
        for size in plan.machines:
            intents = [workers.create_launch_intent(session, run, now) for _ in range(size)]
            if size > 1:
                machine = intents[0].worker.request_id
                for index, intent in enumerate(intents):
                    details = {MACHINE_DETAIL: machine, PEER_INDEX_DETAIL: index}
                    workers.set_launch_details(intent.worker, None, details)
            requests.append((run.launcher, self._request(run, [(i.worker, i.token) for i in intents])))
        by_request = {w.request_id: w for w in by_id.values()}
        for machine_peers in _machines_of([by_request[rid] for rid in plan.relaunch]):
            if machine_peers[0].created_at >= self.started_at:
                continue  # launched by this process moments ago; the launcher has not listed it yet
            rearmed = []
            for worker in machine_peers:
                events.record_event(
                    session, run.id, "worker.relaunch", "launch intent found without instance", now, worker.id
                )
                rearmed.append((worker, workers.reissue_launch_token(worker)))
            requests.append((run.launcher, self._request(run, rearmed)))
        return requests

    def _request(self, run: Run, peers: list[tuple[Worker, str]]) -> LaunchRequest:
        """The launch of one machine: its first peer's request, the others as its siblings."""
        first, *siblings = (PeerRequest(w.request_id, self._peer_env(w, token)) for w, token in peers)
        options = dict(run.launcher_options)
        return LaunchRequest(first.request_id, run.name, first.env, options, tuple(siblings))

    def _peer_env(self, worker: Worker, token: str) -> dict[str, str]:
        return {
            "SPOTSWARM_URL": self.api_url,
            "SPOTSWARM_JOIN_TOKEN": token,
            "SPOTSWARM_REQUEST_ID": worker.request_id,
        }

    def _fail_run(self, session: Session, run: Run, reason: str, now: datetime) -> None:
        try:
            runs.set_run_state(session, run, RunState.failed, reason, now)
        except IllegalTransition as exc:
            logger.info("run %s: %s", run.name, exc)

    def _terminate_orphans(
        self, session: Session, instances: dict[str, tuple[str, Instance]], actions: _Actions, now: datetime
    ) -> None:
        """Stop live instances whose worker row is gone, or ended more than the retire grace ago.

        A worker that deregistered is usually still shutting down (DHT, last upload): it gets the grace
        period to exit by itself. Each orphan is terminated once; the launcher escalates on its own.
        """
        alive = {
            rid: name
            for rid, (name, inst) in instances.items()
            if inst.alive and rid not in self._orphans_terminated
        }
        if not alive:
            return
        columns = (Worker.request_id, Worker.state, Worker.ended_at, Worker.last_heartbeat_at)
        query = select(*columns).where(Worker.request_id.in_(alive))
        rows = {rid: (state, ended, beat) for rid, state, ended, beat in session.execute(query)}
        already = {rid for _, rid in actions.terminations}
        for request_id, launcher_name in alive.items():
            state, ended_at, last_beat = rows.get(request_id, (None, None, None))
            if state in LIVE_WORKER_STATES or request_id in already:
                continue
            if state == WorkerState.lost:
                # Lost but its machine is up: give it one more heartbeat timeout to come back.
                silent_since = max(last_beat or now, self.started_at)
                ended_at = silent_since + timedelta(seconds=self.settings.heartbeat_timeout_s)
            if ended_at is not None and (now - ended_at).total_seconds() < self.settings.retire_grace_s:
                continue
            logger.info(
                "terminating orphan instance of request %s (worker %s)", request_id, state or "unknown"
            )
            actions.terminations.append((launcher_name, request_id))
            self._orphans_terminated.add(request_id)

    # -- 3. act --------------------------------------------------------------------------------------

    def _launch(self, launches: list[tuple[str, LaunchRequest]]) -> int:
        """Call the launchers for committed intents; record handles, or fail rows that can never start."""
        done = 0
        for launcher_name, request in launches:
            try:
                handle = self.launchers[launcher_name].launch(request)
            except LauncherConfigError as exc:
                self._record_launch(request, None, f"launcher rejected the request: {exc}")
                continue
            if not handle:
                continue  # nothing started (e.g. no capacity): the launcher reports why through poll_errors
            self._record_launch(request, handle, None)
            self._capacity_refusals.pop(request.run_name, None)  # the market had a machine again
            done += len(request.peers)
        return done

    def _record_launch(self, request: LaunchRequest, handle: str | None, error: str | None) -> None:
        """Record the machine's handle on each of its peers' rows, or fail each with ``error``."""
        now = self.clock()
        request_ids = [peer.request_id for peer in request.peers]
        with self.db.begin() as session:
            rows = list(session.scalars(select(Worker).where(Worker.request_id.in_(request_ids))))
            if rows and error is not None:
                workers.record_start_failure(session, rows[0].run, error, now)  # one failed launch
            for worker in rows:
                if error is None:
                    workers.set_launch_details(worker, handle, {})
                    events.record_event(
                        session, worker.run_id, "worker.launched", f"handle {handle}", now, worker.id
                    )
                else:
                    self._set_worker(session, worker, WorkerState.failed, error, now)


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _worker_view(worker: Worker, loop_started_at: datetime) -> WorkerView:
    """The policy's view of a row. Heartbeats count from the loop's start at the earliest: after an
    orchestrator restart, workers get one full heartbeat timeout to check in before they are lost."""
    last = worker.last_heartbeat_at
    if last is not None and last < loop_started_at:
        last = loop_started_at
    return WorkerView(
        id=str(worker.id),
        request_id=worker.request_id,
        state=worker.state,
        created_at=worker.created_at.timestamp(),
        registered=worker.registered_at is not None,
        last_heartbeat_at=_ts(last),
        retire_requested_at=_ts(worker.retire_requested_at),
        leaving=worker.phase == LEAVING_PHASE,
        machine=_machine_of(worker),
    )


def _machine_of(worker: Worker) -> str | None:
    """The machine a worker shares with other peers (None: one of its own)."""
    machine = worker.launch_details.get(MACHINE_DETAIL)
    return str(machine) if machine is not None else None


def _machines_of(rows: list[Worker]) -> list[list[Worker]]:
    """``rows`` grouped by the machine they were written for (a row of no machine: one of its own), each
    group in device order."""
    machines: dict[str, list[Worker]] = {}
    for worker in rows:
        machines.setdefault(_machine_of(worker) or worker.request_id, []).append(worker)
    return [
        sorted(peers, key=lambda w: int(w.launch_details.get(PEER_INDEX_DETAIL, 0)))
        for peers in machines.values()
    ]


def _failure_view(failure: LaunchFailure) -> FailureView:
    return FailureView(failure.request_id, failure.reason, failure.retryable, failure.capacity)


def _copy_launch_details(rows: list[Worker], instances: dict[str, tuple[str, Instance]]) -> None:
    """Keep what launchers know of each worker's machine (type, zone, price) on its row, for cost."""
    for worker in rows:
        found = instances.get(worker.request_id)
        if found is None or not found[1].details:
            continue
        details = {k: v for k, v in found[1].details.items() if isinstance(v, (str, int, float, bool))}
        if any(worker.launch_details.get(k) != v for k, v in details.items()):
            workers.set_launch_details(worker, found[1].handle or None, details)
