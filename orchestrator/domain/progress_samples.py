"""Progress samples: one aggregated point per run every ``progress_sample_interval_s``, written by the
heartbeat flusher in its transaction, thinned past ``progress_max_points`` (the whole span is kept).

Each point holds what workers reported (highest epoch, samples; mean loss and metrics and summed
throughput of those with a fresh heartbeat: ``views.run_numbers``) and what the DHT showed (epoch,
samples in the epoch, peers).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from orchestrator.db.models import ProgressSample
from orchestrator.domain import averaging, views
from orchestrator.progress import RunPoint, SwarmProgressCache

logger = logging.getLogger(__name__)


def write(
    session: Session,
    due: Mapping[int, str],
    swarm: SwarmProgressCache,
    now: datetime,
    fresh_after: datetime,
    max_points: int,
) -> list[ProgressSample]:
    """Add a sample for each run of ``due`` (run id -> swarm id) and return them; workers silent since
    ``fresh_after`` count for neither loss, metrics nor throughput (``views.run_numbers``)."""
    written = []
    totals = averaging.run_totals(session, list(due), fresh_after)
    for run_id, numbers in views.run_numbers(session, list(due), fresh_after).items():
        progress = swarm.get(due[run_id])
        sample = ProgressSample(
            run_id=run_id,
            at=now,
            swarm_epoch=numbers.swarm_epoch,
            samples_total=numbers.samples_total,
            loss=numbers.loss,
            samples_per_s=numbers.samples_per_s,
            live_workers=numbers.fresh,
            dht_epoch=progress.epoch if progress else None,
            dht_samples=progress.samples_accumulated if progress else None,
            dht_peers=progress.num_peers if progress else None,
            metrics=numbers.metrics,
            averaging=totals.get(run_id),
        )
        session.add(sample)
        written.append(sample)
        _thin(session, run_id, max_points)
    return written


def as_point(run_name: str, sample: ProgressSample) -> RunPoint:
    """``sample`` of the run called ``run_name`` as a point to forward (read before its session ends)."""
    figures = {
        "samples_total": float(sample.samples_total),
        "samples_per_s": sample.samples_per_s,
        "live_workers": float(sample.live_workers),
    }
    if sample.loss is not None:
        figures["loss"] = sample.loss
    epoch = max(sample.swarm_epoch, sample.dht_epoch or 0)
    return RunPoint(run_name, sample.at, epoch, figures, dict(sample.metrics or {}))


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
