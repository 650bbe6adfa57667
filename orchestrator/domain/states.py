"""The run and worker lifecycles: the allowed transitions, and every set of states a rule names.

The state enums themselves (:class:`~worker.protocol.runs.RunState`,
:class:`~worker.protocol.workers.WorkerState`) are in ``worker/protocol/``: API answers carry them, and
workers and clients read them. :class:`StopCause` (why a run stopped) is a column's values, in
``db/models.py``. Rows hold the enums (stored as their string values), so rows, queries and these sets
compare enums with enums. ``runs.set_run_state`` and ``runs.set_worker_state`` are the only code that
changes a state, and they allow only the transitions below.
"""

from __future__ import annotations

from worker.protocol.runs import RunState, StopCause
from worker.protocol.workers import WorkerState

__all__ = [
    "ACCEPTING_RUN_STATES",
    "ACTIVE_RUN_STATES",
    "ENDED_WORKER_STATES",
    "FINISHED_RUN_STATES",
    "LIVE_WORKER_STATES",
    "REVIVABLE_WORKER_STATES",
    "RUN_TRANSITIONS",
    "STOPPED_RUN_STATES",
    "TOKEN_WORKER_STATES",
    "UNENDED_WORKER_STATES",
    "WORKER_TRANSITIONS",
    "RunState",
    "StopCause",
    "WorkerState",
    "settled_state",
]

# Allowed run transitions. A run is created ``pending`` and becomes ``running`` when its first worker
# registers. ``stopping`` waits for workers to leave (the reconciler, or the last worker leaving, ends
# it in ``stopped``, or ``completed`` when the stop condition was reached). Every finished run can be
# resumed (back to ``pending``; a completed one with a target it has not reached yet). A transition to
# the current state is a no-op, not an error.
RUN_TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.pending: frozenset({RunState.running, RunState.stopping, RunState.failed}),
    RunState.running: frozenset({RunState.stopping, RunState.completed, RunState.failed}),
    RunState.stopping: frozenset({RunState.stopped, RunState.completed, RunState.failed}),
    RunState.stopped: frozenset({RunState.pending}),
    RunState.failed: frozenset({RunState.pending}),
    RunState.completed: frozenset({RunState.pending}),
}

# Allowed worker transitions. ``launching`` is the intent written before the launcher is called;
# ``running`` starts at registration. ``lost`` (silent past the heartbeat timeout, or its machine
# vanished) is not final: a lost worker that heartbeats again is running again. ``interrupted``
# (spot notice), ``exited`` (left or terminated cleanly) and ``failed`` are final.
WORKER_TRANSITIONS: dict[WorkerState, frozenset[WorkerState]] = {
    WorkerState.launching: frozenset(
        {
            WorkerState.running,
            WorkerState.lost,
            WorkerState.interrupted,
            WorkerState.exited,
            WorkerState.failed,
        }
    ),
    WorkerState.running: frozenset(
        {WorkerState.lost, WorkerState.interrupted, WorkerState.exited, WorkerState.failed}
    ),
    WorkerState.lost: frozenset(
        {WorkerState.running, WorkerState.interrupted, WorkerState.exited, WorkerState.failed}
    ),
    WorkerState.interrupted: frozenset(),
    WorkerState.exited: frozenset(),
    WorkerState.failed: frozenset(),
}

#: Runs the orchestrator looks after: the reconcile loop, the heartbeat cache, swarm tokens, checkpoints.
ACTIVE_RUN_STATES = frozenset({RunState.pending, RunState.running, RunState.stopping})
#: Runs that take workers: registrations, launches, and heartbeat replies that say "proceed".
ACCEPTING_RUN_STATES = frozenset({RunState.pending, RunState.running})
#: Runs that ended: they can be resumed or deleted, and keep their last reported values.
FINISHED_RUN_STATES = frozenset({RunState.stopped, RunState.completed, RunState.failed})
#: Runs a stop request leaves as they are (asked already, or stopped); it refuses the other finished ones.
STOPPED_RUN_STATES = frozenset({RunState.stopping, RunState.stopped})

#: Workers that count towards a run's workers: launched and not yet registered, or registered and training.
LIVE_WORKER_STATES = frozenset({WorkerState.launching, WorkerState.running})
#: Workers that can still change: their tokens still work, the heartbeat cache holds them.
UNENDED_WORKER_STATES = frozenset(s for s, after in WORKER_TRANSITIONS.items() if after)
#: Workers that ended (no transition leaves these): their tokens grant nothing.
ENDED_WORKER_STATES = frozenset(s for s, after in WORKER_TRANSITIONS.items() if not after)
#: Workers a heartbeat brings back to running: not registered yet, or lost (``heartbeats/writer.py``).
REVIVABLE_WORKER_STATES = frozenset(s for s, to in WORKER_TRANSITIONS.items() if WorkerState.running in to)
#: Registered workers that may hold a swarm token (a lost one is running again when it speaks again).
TOKEN_WORKER_STATES = frozenset({WorkerState.running, WorkerState.lost})


def settled_state(stop_cause: StopCause | None, target_reached: bool) -> RunState:
    """The state a stopping run ends in once its workers have all left: ``completed`` when it was stopped
    because its target was met (``stop_cause``) or the swarm meets it now (``target_reached``), else
    ``stopped``."""
    if stop_cause == StopCause.target_reached or target_reached:
        return RunState.completed
    return RunState.stopped
