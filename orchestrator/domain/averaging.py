"""Whether a run's workers train one model: their averaging outcomes over a recent window, and the warning.

Workers report cumulative outcome counts (``wire.AveragingCounts``) in heartbeats. Each progress sample
stores the run's counts summed over its workers, so the window is the difference between the newest
sample and the newest one at least ``averaging_window_s`` older: a query, the same on every orchestrator
and after a restart. The heartbeat flusher judges each run when it samples it and keeps the result on
the run (``runs.averaging``), which the API, the page, the CLI and ``/metrics`` read.

The same window gives the swarm's batch: samples the run's workers contributed per swarm epoch, against
``target_batch_size`` (``batch_ratio`` 1.0 is the batch asked for; peers that each count only their own
samples push it towards the number of workers).

The warning has hysteresis: it is raised (one ``run.averaging`` event) only when the whole window is
covered, 2+ workers are live and the averaged fraction is below ``averaging_warning_fraction``; it is
cleared (another event) once a covered window is at or above it, or fewer than 2 workers are live. A
window counts as covered only from a sample at which 2+ live workers had stepped through an epoch: the
epochs a first worker trains before its partner's first step are ``alone`` by necessity, not a split.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import ProgressSample, Run, Worker
from orchestrator.domain import events
from worker.protocol.workers import AVERAGING_OUTCOMES, AVERAGING_TIMES, AveragingCounts

EVENT_KIND = "run.averaging"
#: the key of a sample's counts that holds how many live workers had reported counts (had trained)
TRAINING_WORKERS = "training_workers"
#: the keys of a worker's counts that a run's totals sum (the seconds as floats, the rest as ints)
SUMMED_COUNTS = (*AVERAGING_OUTCOMES, "group_size_sum", "kept_samples", *AVERAGING_TIMES)
LOCAL_OUTCOMES = ("alone", "no_group", "timeout", "failed")
ADVICE = (
    "its workers are training apart, not as one model. Check that they can reach each other (same "
    "swarm, open ports; a split swarm shows every epoch as 'alone'), raise averaging_timeout when "
    "rounds time out, and raise matchmaking_time or target_batch_size when no group forms in time"
)


def run_totals(
    session: Session, run_ids: Sequence[int], fresh_after: datetime | None = None
) -> dict[int, dict[str, Any]]:
    """Each run's outcome counts summed over its workers (those that reported any); with ``fresh_after``,
    also how many of those heartbeated since then (``TRAINING_WORKERS``: live workers that trained)."""
    totals: dict[int, dict[str, Any]] = {}
    if not run_ids:
        return totals
    query = select(Worker.run_id, Worker.averaging, Worker.last_heartbeat_at).where(
        Worker.run_id.in_(list(run_ids))
    )
    for run_id, counts, heartbeat_at in session.execute(query):
        if not counts:  # not reported (a JSON null is not SQL NULL: filtered here, not in SQL)
            continue
        total = totals.setdefault(run_id, dict.fromkeys(SUMMED_COUNTS, 0))
        add_counts(total, counts)
        if fresh_after is not None:
            live = heartbeat_at is not None and heartbeat_at >= fresh_after
            total[TRAINING_WORKERS] = total.get(TRAINING_WORKERS, 0) + int(live)
    return totals


def add_counts(total: dict[str, Any], counts: Mapping[str, Any]) -> None:
    """Add one worker's counts to a run's ``total`` (the seconds as floats, the rest as ints)."""
    for key in SUMMED_COUNTS:
        total[key] = total.get(key, 0) + (
            float(counts.get(key, 0)) if key in AVERAGING_TIMES else int(counts.get(key, 0))
        )


def swarm_batch(samples: int, epochs: int, target_batch_size: int) -> dict[str, float | None]:
    """Samples per swarm epoch over a window, and that as a multiple of ``target_batch_size``."""
    if epochs <= 0 or samples <= 0:
        return {"samples_per_epoch": None, "batch_ratio": None}
    per_epoch = samples / epochs
    return {"samples_per_epoch": per_epoch, "batch_ratio": per_epoch / target_batch_size}


def time_split(train_s: float, averaging_s: float) -> dict[str, float | None]:
    """Of ``train_s`` worker-seconds, ``averaging_s`` waited on averaging: the share waiting, and G, the
    compute per averaging round over the round's cost (compute / waiting: the same ratio per round).
    None where the seconds do not say (no training time; no waiting, where G is unbounded)."""
    compute_s = max(0.0, train_s - averaging_s)
    return {
        "train_s": round(train_s, 3),
        "averaging_s": round(averaging_s, 3),
        "waiting_share": min(1.0, averaging_s / train_s) if train_s > 0 else None,
        "g": compute_s / averaging_s if averaging_s > 0 else None,
    }


def summarize(
    newest: Mapping[str, Any], oldest: Mapping[str, Any] | None, window_s: float, covered: bool
) -> dict[str, Any]:
    """The window's outcomes (``newest`` minus ``oldest`` counts), its averaged fraction and group size,
    and how its workers' time split between compute and waiting on averaging (:func:`time_split`)."""
    base = oldest or {}
    outcomes = {key: max(0, int(newest.get(key, 0)) - int(base.get(key, 0))) for key in AVERAGING_OUTCOMES}
    groups = max(0, int(newest.get("group_size_sum", 0)) - int(base.get("group_size_sum", 0)))
    epochs = sum(outcomes.values())
    averaged = outcomes["averaged"]
    seconds = {key: max(0.0, float(newest.get(key, 0)) - float(base.get(key, 0))) for key in AVERAGING_TIMES}
    return {
        "window_s": window_s,
        "covered": covered,
        "epochs": epochs,
        "outcomes": outcomes,
        "averaged_fraction": averaged / epochs if epochs else None,
        "mean_group_size": groups / averaged if averaged else None,
        **time_split(seconds["train_s"], seconds["averaging_s"]),
    }


def judge(
    session: Session,
    run: Run,
    now: datetime,
    live_workers: int,
    window_s: float,
    threshold: float,
) -> None:
    """Measure ``run``'s window from its progress samples, store it on the run, raise or clear the warning."""
    samples = _window_samples(session, run.id, now, window_s)
    if not samples:
        return
    newest, oldest = samples[-1], samples[0]
    together = int((oldest.averaging or {}).get(TRAINING_WORKERS, 0)) >= 2
    covered = together and oldest.at <= now - timedelta(seconds=window_s)
    window = summarize(
        newest.averaging or {}, oldest.averaging if len(samples) > 1 else None, window_s, covered
    )
    window.update(
        swarm_batch(
            newest.samples_total - oldest.samples_total,
            newest.swarm_epoch - oldest.swarm_epoch,
            run.target_batch_size,
        )
    )
    previous = run.averaging or {}
    warning = previous.get("warning")
    fraction = window["averaged_fraction"]
    if live_workers < 2 or (covered and fraction is not None and fraction >= threshold):
        if warning:
            why = (
                f"fewer than 2 live workers ({live_workers})"
                if live_workers < 2
                else f"averaging recovered: {_share(window)}"
            )
            events.record_event(session, run.id, EVENT_KIND, f"averaging warning cleared: {why}", now)
        warning = None
    elif covered and fraction is not None and fraction < threshold and not warning:
        warning = f"{_share(window)} with {live_workers} live workers, below {threshold:.0%}: {ADVICE}"
        events.record_event(session, run.id, EVENT_KIND, warning, now)
    run.averaging = {
        **window,
        "live_workers": live_workers,
        "warning": warning,
        "swarm_formed": previous.get("swarm_formed"),  # judged at each flush: domain/swarm_forming.py
        "at": now.isoformat(),
    }


def _share(window: Mapping[str, Any]) -> str:
    fraction = window["averaged_fraction"] or 0.0
    local = {k: window["outcomes"][k] for k in LOCAL_OUTCOMES if window["outcomes"][k]}
    detail = ", ".join(f"{k} {n}" for k, n in local.items()) or "none local"
    return (
        f"{fraction:.0%} of {window['epochs']} worker-epochs averaged over the last "
        f"{window_text(window['window_s'])} (local: {detail})"
    )


def window_text(seconds: float) -> str:
    """``5 min`` for whole minutes, else ``20 s``."""
    return f"{seconds / 60:g} min" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g} s"


def _window_samples(session: Session, run_id: int, now: datetime, window_s: float) -> list[ProgressSample]:
    """The run's samples with counts from the newest one at or before the window's start (else the
    oldest of the two windows before now) to the newest."""
    start = now - timedelta(seconds=window_s)
    rows = session.scalars(
        select(ProgressSample)
        .where(ProgressSample.run_id == run_id, ProgressSample.at >= start - timedelta(seconds=window_s))
        .order_by(ProgressSample.at, ProgressSample.id)
    ).all()
    counted = [row for row in rows if row.averaging]
    before = [i for i, row in enumerate(counted) if row.at <= start]
    return counted[before[-1] :] if before else counted


def worker_fraction(counts: Mapping[str, Any] | None) -> float | None:
    """A worker's averaged fraction since it started (None before it reported an epoch)."""
    if not counts:
        return None
    parsed = AveragingCounts.model_validate(dict(counts))
    return parsed.averaged / parsed.epochs if parsed.epochs else None


def counts_by_outcome(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Outcome counts summed over ``rows`` (for ``/metrics``: labels are the fixed outcome names)."""
    total = dict.fromkeys(AVERAGING_OUTCOMES, 0)
    for row in rows:
        for key in total:
            total[key] += int(row.get(key, 0))
    return total
