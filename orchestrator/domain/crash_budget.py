"""A run's crash budget: launched workers that keep failing with the same error after training fail the run.

Without it a bug that raises after a few batches relaunches workers forever (on EC2, each a new spot
instance). The rule: a *launched* worker that deregisters with an error *after contributing samples*
counts; when ``budget`` such workers of the run failed with the very same message within ``window_s``,
the run becomes ``failed`` with that message. Why this rule:

- interrupted and lost workers never count (they leave with another reason, or none): spot churn, however
  heavy, cannot fail a healthy run;
- workers joined by hand never count: a join token's holder must not be able to fail the run;
- a failure before any sample is a start-up failure (``workers.record_start_failure``), judged apart;
- the same message within a window: a bug repeats itself at once, while a rare fault (an out-of-memory
  now and then) stays under the budget however long the run lives.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from orchestrator.db.models import Worker
from orchestrator.domain import runs
from orchestrator.domain.states import ACCEPTING_RUN_STATES
from worker.protocol.runs import RunState
from worker.protocol.workers import WorkerState


@dataclass(frozen=True)
class CrashPolicy:
    """The server's defaults (``SPOTSWARM_MAX_WORKER_CRASHES``, ``SPOTSWARM_CRASH_WINDOW_S``)."""

    default_budget: int = 5
    window_s: float = 3600.0


def counts(worker: Worker) -> bool:
    """Whether this failed worker's failure counts toward its run's crash budget."""
    return worker.state == WorkerState.failed and not worker.manual and worker.samples > 0


def same_crashes(session: Session, worker: Worker, since: datetime) -> int:
    """Launched workers of the run failed after training with ``worker``'s exit reason since ``since``."""
    query = (
        select(func.count())
        .select_from(Worker)
        .where(
            Worker.run_id == worker.run_id,
            Worker.state == WorkerState.failed,
            Worker.manual.is_(False),
            Worker.samples > 0,
            Worker.exit_reason == worker.exit_reason,
            Worker.ended_at >= since,
        )
    )
    return int(session.scalar(query) or 0)


def judge(session: Session, worker: Worker, policy: CrashPolicy, now: datetime) -> bool:
    """After ``worker`` failed: fail its run when the crash budget is spent; True if it did."""
    run = worker.run
    if not counts(worker) or run.state not in ACCEPTING_RUN_STATES:
        return False
    budget = run.max_worker_crashes or policy.default_budget
    session.flush()
    crashes = same_crashes(session, worker, now - timedelta(seconds=policy.window_s))
    if crashes < budget:
        return False
    reason = f"{crashes} workers failed with the same error after training: {worker.exit_reason}"
    runs.set_run_state(session, run, RunState.failed, reason, now)
    return True
