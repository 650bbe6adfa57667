"""Whether a run's swarm formed at all: a warning within seconds, and a note in the state it ends in.

The averaging window (:mod:`orchestrator.domain.averaging`) judges the share of averaged epochs over
minutes, and only once the window is covered: a run whose workers never find each other could train
for minutes, or complete, as N separate models without a word. This is judged at every heartbeat flush
from each worker's latest cumulative outcome counts (``wire.AveragingCounts``):

- **apart**: 2 or more live workers have reported counts, none of them has averaged an epoch since it
  started, and each has applied at least ``apart_epochs`` epochs on its own gradients (a worker that
  starts first trains a few epochs alone by necessity; its partner's first rounds need a few seconds).
  Once that has lasted ``apart_s`` (the writer keeps the time), the run's ``averaging.warning`` is set
  (one ``run.averaging`` event) and ``averaging.swarm_formed`` is false;
- **formed**: a worker of the run averaged an epoch. ``swarm_formed`` becomes true, a warning raised
  here is cleared, and from then on the window judges the run.

A run that ends (stopped, completed, failed) after 2 or more of its workers trained without one averaged
epoch among them says so in its state reason (:func:`ended_note`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Run, Worker
from orchestrator.domain import events
from orchestrator.domain.averaging import ADVICE, EVENT_KIND, add_counts, summarize
from worker.protocol.workers import AveragingCounts


def counts_of(raw: Mapping[str, Any] | None) -> AveragingCounts | None:
    """A worker's stored counts, parsed (None when it reported none)."""
    return AveragingCounts.model_validate(dict(raw)) if raw else None


def formed(counts: Iterable[AveragingCounts]) -> bool:
    """True once any of the workers averaged an epoch."""
    return any(c.averaged > 0 for c in counts)


def apart(live: Sequence[AveragingCounts], apart_epochs: int) -> bool:
    """2+ live workers, none of which averaged, each with ``apart_epochs`` or more local epochs."""
    return len(live) >= 2 and not formed(live) and all(c.local >= apart_epochs for c in live)


def _total(counts: Iterable[AveragingCounts]) -> dict[str, Any]:
    total: dict[str, Any] = {}
    for c in counts:
        add_counts(total, c.model_dump())
    return total


def raise_apart(
    session: Session, run: Run, live: Sequence[AveragingCounts], now: datetime, window_s: float
) -> None:
    """Mark ``run`` apart (``swarm_formed`` false) and warn, unless its warning says so already."""
    previous = run.averaging or {}
    if previous.get("swarm_formed") is False and previous.get("warning"):
        return
    totals = _total(live)
    local = {k: totals[k] for k in ("alone", "no_group", "timeout", "failed") if totals.get(k)}
    detail = ", ".join(f"{k} {n}" for k, n in local.items())
    warning = (
        f"its swarm has not formed: none of its {len(live)} live workers has averaged an epoch "
        f"(each applied {min(c.local for c in live)}+ epochs on its own gradients; {detail}): {ADVICE}"
    )
    base = previous or {
        **summarize(totals, None, window_s, covered=False),
        "samples_per_epoch": None,
        "batch_ratio": None,
    }
    run.averaging = {
        **base,
        "live_workers": len(live),
        "warning": warning,
        "swarm_formed": False,
        "at": now.isoformat(),
    }
    events.record_event(session, run.id, EVENT_KIND, warning, now)


def mark_formed(session: Session, run: Run, now: datetime) -> None:
    """Mark ``run``'s swarm formed; clear the warning :func:`raise_apart` set."""
    previous = run.averaging or {}
    if previous.get("swarm_formed") is True:
        return
    if previous.get("swarm_formed") is False and previous.get("warning"):
        message = "averaging warning cleared: its workers average with each other"
        events.record_event(session, run.id, EVENT_KIND, message, now)
        previous = {**previous, "warning": None}
    if previous:
        run.averaging = {**previous, "swarm_formed": True}


def ended_note(session: Session, run: Run) -> str | None:
    """What a run ending now says when 2+ of its workers trained and none of them averaged an epoch."""
    rows = session.scalars(select(Worker.averaging).where(Worker.run_id == run.id)).all()
    counts = [c for c in map(counts_of, rows) if c is not None and c.local > 0]
    if len(counts) < 2 or formed(counts):
        return None
    return (
        f"its swarm never formed: its {len(counts)} workers trained apart "
        f"({sum(c.local for c in counts)} worker-epochs, none of them averaged): they did not reach "
        "each other, and each trained a model of its own"
    )
