"""Noticing, on the worker, that it trains alone while its run has other workers.

A worker whose peers cannot reach it applies every epoch on its own gradients: it trains a model of its
own, and nothing in its log said so. :class:`ApartWatch` follows the worker's cumulative averaging
outcomes (``worker/strategy/outcomes.py``) and the run's live worker count (from heartbeat replies) and
says once, in a warning, when its epochs since its last averaged one were all applied locally for at
least ``min_epochs`` epochs and ``min_s`` seconds while the run had 2 or more live workers, and once
again when an epoch is averaged after that. The time bound spares the first worker of a run the warning
while its partners, registered already, still boot.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from worker.protocol.workers import AveragingCounts

#: epochs in a row applied without averaging, while the run has other workers, before the warning
DEFAULT_APART_EPOCHS = 5
#: and for at least this long: a partner that registered can take this long to boot and train
DEFAULT_APART_S = 30.0


@dataclass
class ApartWatch:
    """Counts this worker's local epochs since its last averaged one; see the module docstring."""

    min_epochs: int = DEFAULT_APART_EPOCHS
    min_s: float = DEFAULT_APART_S
    clock: Callable[[], float] = time.monotonic
    _last: AveragingCounts = field(default_factory=AveragingCounts)
    _streak: int = 0
    _since: float | None = None  # when the run last had 2+ live workers while this one trained apart
    _warned: bool = False

    def update(self, counts: AveragingCounts | None, live_workers: int) -> str | None:
        """Take the latest counts; a message to log (warning) when this worker's state changed, else None."""
        if counts is None:
            return None
        last, self._last = self._last, counts
        if counts.averaged > last.averaged:
            self._streak, self._since = 0, None
            if self._warned:
                self._warned = False
                return "averaging again: this worker's latest epoch was averaged with its peers"
            return None
        self._streak += max(0, counts.local - last.local)
        if live_workers < 2:
            self._since = None
            return None
        now = self.clock()
        self._since = now if self._since is None else self._since
        if self._warned or self._streak < self.min_epochs or now - self._since < self.min_s:
            return None
        self._warned = True
        return (
            f"training alone: the last {self._streak} epochs were applied on this worker's own gradients "
            f"(outcomes so far: {_outcomes(counts)}), {now - self._since:.0f} s of them while the run had "
            f"{live_workers} live workers: its peers do not average with this one, so it trains a model "
            "of its own"
        )


def _outcomes(counts: AveragingCounts) -> str:
    fields = ("averaged", "alone", "no_group", "timeout", "failed", "downloaded")
    return ", ".join(f"{name} {getattr(counts, name)}" for name in fields if getattr(counts, name))
