"""A run's derived numbers, computed once here and returned in the API's views (``cost_usd``, ``eta_s``):
the status page, the CLI and ``/metrics`` show these values and compute none of their own.

- Cost so far: over the workers whose launcher reports a price in their ``launch_details``
  (``price_usd_per_hour``, else ``price_per_hour``: the first key that holds a number wins), that price
  times the hours from registration (or launch) to the end (or now).
- ETA: the samples still missing to the stop condition over the run's current samples/s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Worker
from orchestrator.domain.states import FINISHED_RUN_STATES, RunState
from worker.protocol.runs import StopCondition

#: Keys of a worker's ``launch_details`` that hold its price in USD per hour, in order of precedence.
PRICE_KEYS = ("price_usd_per_hour", "price_per_hour")


def price_per_hour(details: Mapping[str, Any] | None) -> float | None:
    """The worker's price in USD per hour: the first of :data:`PRICE_KEYS` holding a number, else None."""
    for key in PRICE_KEYS:
        value = (details or {}).get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def worker_cost_usd(
    details: Mapping[str, Any] | None,
    registered_at: datetime | None,
    created_at: datetime,
    ended_at: datetime | None,
    now: datetime,
) -> float | None:
    """Price per hour times the hours from registration (or launch) to the end (or ``now``); None
    without a price."""
    price = price_per_hour(details)
    if price is None:
        return None
    hours = max(0.0, ((ended_at or now) - (registered_at or created_at)).total_seconds()) / 3600.0
    return price * hours


def run_costs(session: Session, now: datetime, run_ids: Sequence[int] | None = None) -> dict[int, float]:
    """Cost so far of each run (of ``run_ids``, else of all) that has a worker with a price; runs
    without one are left out."""
    query = select(
        Worker.run_id, Worker.launch_details, Worker.registered_at, Worker.created_at, Worker.ended_at
    )
    if run_ids is not None:
        query = query.where(Worker.run_id.in_(list(run_ids)))
    costs: dict[int, float] = {}
    for run_id, details, registered_at, created_at, ended_at in session.execute(query):
        cost = worker_cost_usd(details, registered_at, created_at, ended_at, now)
        if cost is not None:
            costs[run_id] = costs.get(run_id, 0.0) + cost
    return costs


def eta_s(
    state: RunState,
    stop: StopCondition,
    target_batch_size: int,
    *,
    samples_total: int,
    samples_per_s: float,
    swarm_epoch: int,
    samples_in_epoch: int,
) -> float | None:
    """Seconds until the stop condition at ``samples_per_s``; None when the run has finished, is not
    moving, or has no stop condition.

    With ``target_samples`` the missing samples are ``target_samples - samples_total``; with
    ``target_epochs`` they are ``(target_epochs - swarm_epoch) * target_batch_size - samples_in_epoch``
    (what the current epoch already holds); with both, the sooner one.
    """
    if state in FINISHED_RUN_STATES or samples_per_s <= 0:
        return None
    missing: list[float] = []
    if stop.target_samples:
        missing.append(stop.target_samples - samples_total)
    if stop.target_epochs:
        missing.append((stop.target_epochs - swarm_epoch) * target_batch_size - samples_in_epoch)
    return max(0.0, min(missing) / samples_per_s) if missing else None
