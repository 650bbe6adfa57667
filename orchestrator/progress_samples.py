"""Progress samples: one aggregated point per run every ``progress_sample_interval_s``, written by the
heartbeat flusher in its transaction, thinned past ``progress_max_points`` (the whole span is kept).

Each point holds what workers reported (highest epoch, samples, mean loss and summed throughput of
those with a fresh heartbeat) and what the DHT showed (epoch, samples in the epoch, peers).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime

from sqlalchemy import case, delete, func, select
from sqlalchemy.orm import Session

from orchestrator.db.models import ProgressSample, Worker
from orchestrator.dht import SwarmProgressCache
from worker.wire import WorkerState

logger = logging.getLogger(__name__)


def write(
    session: Session,
    due: Mapping[int, str],
    swarm: SwarmProgressCache,
    now: datetime,
    fresh_after: datetime,
    max_points: int,
) -> None:
    """Add a sample for each run of ``due`` (run id -> swarm id); workers silent since ``fresh_after``
    count for neither loss nor throughput."""
    for row in _aggregate(session, due.keys(), fresh_after):
        progress = swarm.get(due[row.run_id])
        session.add(
            ProgressSample(
                run_id=row.run_id,
                at=now,
                swarm_epoch=int(row.epoch or 0),
                samples_total=int(row.samples or 0),
                loss=float(row.loss) if row.loss is not None else None,
                samples_per_s=float(row.speed or 0.0),
                live_workers=int(row.live or 0),
                dht_epoch=progress.epoch if progress else None,
                dht_samples=progress.samples_accumulated if progress else None,
                dht_peers=progress.num_peers if progress else None,
            )
        )
        _thin(session, row.run_id, max_points)


def _aggregate(session: Session, run_ids: Iterable[int], fresh_after: datetime) -> list:  # type: ignore[type-arg]
    fresh = (Worker.state == WorkerState.running.value) & (Worker.last_heartbeat_at >= fresh_after)
    query = (
        select(
            Worker.run_id.label("run_id"),
            func.max(Worker.swarm_epoch).label("epoch"),
            func.sum(Worker.samples).label("samples"),
            func.avg(case((fresh, Worker.loss))).label("loss"),
            func.sum(case((fresh, Worker.samples_per_s), else_=0.0)).label("speed"),
            func.sum(case((fresh, 1), else_=0)).label("live"),
        )
        .where(Worker.run_id.in_(list(run_ids)))
        .group_by(Worker.run_id)
    )
    return list(session.execute(query))


def _thin(session: Session, run_id: int, max_points: int) -> None:
    """Past ``max_points`` samples, drop every second one of the older half (keeps the whole span)."""
    count = session.scalar(select(func.count()).where(ProgressSample.run_id == run_id)) or 0
    if count <= max_points:
        return
    older = session.scalars(
        select(ProgressSample.id)
        .where(ProgressSample.run_id == run_id)
        .order_by(ProgressSample.at, ProgressSample.id)
        .limit(count // 2)
    ).all()
    doomed = list(older[1::2])
    session.execute(delete(ProgressSample).where(ProgressSample.id.in_(doomed)))
    logger.debug("run %s: thinned %d progress samples", run_id, len(doomed))
