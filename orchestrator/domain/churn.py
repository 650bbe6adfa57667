"""Churn as a run's page shows it: the desired worker count at each progress sample, the marks of spot
notices and lost workers, and the run's goodput over the last hour.

All of it is read from what is stored already (progress samples and events): the desired count from the
``run.scaled`` events, the marks from the ``worker.state`` events into ``interrupted`` (a worker left
after a spot notice) and ``lost`` (no heartbeat, process or instance gone, killed without notice).

Goodput (:func:`goodput`) is defined here and only here: the training progress the run made over the
hour up to its latest sample, divided by the progress a steady swarm of the workers it held would have
made, at the best per-worker rate the run itself kept up while its live worker count stood still.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from orchestrator.db.models import Event
from worker.protocol.workers import WorkerState

#: the span goodput is measured over, up to the run's latest progress sample
GOODPUT_WINDOW_S = 3600.0
#: a steady stretch counts once its swarm epoch went up this often after the stretch's first increase
#: (rates are measured from one epoch boundary to another, so whole epochs do not skew them)
MIN_STEADY_EPOCHS = 2
#: marks returned at most (the newest)
MAX_MARKS = 500
#: the worker states a mark is made for, and the mark's kind
MarkKind = Literal["notice", "loss"]
MARK_KINDS: dict[WorkerState, MarkKind] = {WorkerState.interrupted: "notice", WorkerState.lost: "loss"}

_STATE_EVENT = re.compile(r"^(?P<old>\w+) -> (?P<new>\w+): (?P<reason>.*)$", re.DOTALL)
_SCALED_EVENT = re.compile(r"^desired (?P<old>\d+) -> (?P<new>\d+)\b")


@dataclass(frozen=True)
class Sample:
    """What goodput reads of one progress sample."""

    at: datetime
    epoch: int  # the swarm epoch then (highest of the workers' reports and the DHT's)
    live: int  # workers running with a fresh heartbeat then
    #: samples in the model by then where the workers count them (DiLoCo: their ``kept_samples``); None:
    #: the epochs' samples (``"gradients"``: each epoch is ``target_batch_size`` of them)
    kept: int | None = None

    def progress(self, samples_per_epoch: int) -> int:
        """Samples in the model by then."""
        return self.kept if self.kept is not None else self.epoch * samples_per_epoch


@dataclass(frozen=True)
class Goodput:
    """A run's goodput over a window and the figures it comes from."""

    value: float
    window_s: float
    progress_samples: int
    worker_s: float
    steady_samples_per_worker_s: float


@dataclass(frozen=True)
class Mark:
    """A worker that left after a spot notice (``notice``) or was lost (``loss``), when it happened."""

    at: datetime
    kind: MarkKind
    worker_id: int | None
    reason: str


def goodput(samples: Sequence[Sample], samples_per_epoch: int) -> Goodput | None:
    """Goodput over the :data:`GOODPUT_WINDOW_S` up to the last of ``samples`` (oldest first).

    progress / (steady rate x worker-seconds held): progress is the samples that went into the model in
    the window (:meth:`Sample.progress`: in DiLoCo the samples its rounds kept, not rounds, which come by
    the clock however many workers train); worker-seconds sum the live workers over the time between
    samples; the steady rate is the best samples per worker-second of a stretch in which the live count
    stood still, from its first epoch boundary to its last (:func:`steady_rate`). None until such a
    stretch exists.
    """
    if len(samples) < 2:
        return None
    start = samples[-1].at - timedelta(seconds=GOODPUT_WINDOW_S)
    window = [s for s in samples if s.at >= start]
    rate = steady_rate(window, samples_per_epoch)
    worker_s = sum(a.live * (b.at - a.at).total_seconds() for a, b in itertools.pairwise(window))
    if rate is None or worker_s <= 0:
        return None
    progress = max(0, window[-1].progress(samples_per_epoch) - window[0].progress(samples_per_epoch))
    return Goodput(
        value=progress / (rate * worker_s),
        window_s=(window[-1].at - window[0].at).total_seconds(),
        progress_samples=progress,
        worker_s=worker_s,
        steady_samples_per_worker_s=rate,
    )


def steady_rate(samples: Sequence[Sample], samples_per_epoch: int) -> float | None:
    """The best samples per worker-second over the stretches of ``samples`` with one live count (> 0),
    each measured between the first and last samples at which its epoch went up (at least
    :data:`MIN_STEADY_EPOCHS` epochs apart); None when no stretch has that many."""
    best = None
    for live, group in itertools.groupby(samples, key=lambda s: s.live):
        stretch = list(group)
        if live <= 0:
            continue
        boundaries = [b for a, b in itertools.pairwise(stretch) if b.epoch > a.epoch]
        if len(boundaries) < 2:
            continue
        first, last = boundaries[0], boundaries[-1]
        epochs, seconds = last.epoch - first.epoch, (last.at - first.at).total_seconds()
        if epochs < MIN_STEADY_EPOCHS or seconds <= 0:
            continue
        kept = last.progress(samples_per_epoch) - first.progress(samples_per_epoch)
        if kept <= 0:  # rounds came, none kept a sample (all discarded, or workers that never report it)
            continue
        rate = kept / (live * seconds)
        best = rate if best is None else max(best, rate)
    return best


def desired_at(times: Sequence[datetime], scaled: Sequence[tuple[datetime, str]], current: int) -> list[int]:
    """The desired worker count at each of ``times``: the ``old`` count of the first ``run.scaled`` event
    (``(at, message)``, oldest first) after it, else ``current`` (the run's count now)."""
    steps = []  # (at, the count before that event)
    for at, message in scaled:
        match = _SCALED_EVENT.match(message)
        if match:
            steps.append((at, int(match["old"])))
    counts, index = [], 0
    for t in times:
        while index < len(steps) and steps[index][0] <= t:
            index += 1
        counts.append(steps[index][1] if index < len(steps) else current)
    return counts


def scaled_events(session: Session, run_id: int) -> list[tuple[datetime, str]]:
    """The run's ``run.scaled`` events, ``(at, message)``, oldest first."""
    query = (
        select(Event.at, Event.message)
        .where(Event.run_id == run_id, Event.kind == "run.scaled")
        .order_by(Event.id)
    )
    return [(at, message) for at, message in session.execute(query)]


def marks(session: Session, run_id: int) -> list[Mark]:
    """The run's notice and loss marks (the newest :data:`MAX_MARKS`), oldest first."""
    into = [Event.message.like(f"% -> {state.value}: %") for state in MARK_KINDS]
    query = (
        select(Event)
        .where(Event.run_id == run_id, Event.kind == "worker.state", or_(*into))
        .order_by(Event.id.desc())
        .limit(MAX_MARKS)
    )
    found = []
    for event in session.scalars(query):
        match = _STATE_EVENT.match(event.message)
        if match is None or match["new"] not in {s.value for s in MARK_KINDS}:
            continue
        kind = MARK_KINDS[WorkerState(match["new"])]
        found.append(Mark(event.at, kind, event.worker_id, match["reason"]))
    return found[::-1]
