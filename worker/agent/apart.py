"""Noticing, on the worker, that it trains alone while its run has other workers.

A worker whose peers cannot reach it applies every epoch on its own gradients: it trains a model of its
own, and nothing in its log said so. :class:`ApartWatch` follows the worker's cumulative averaging
outcomes (``worker/strategy/outcomes.py``) and the run's live worker count (from heartbeat replies) and
says once, in a warning, when ``min_epochs`` epochs in a row were applied locally while the run had 2 or
more workers, and once again when an epoch is averaged after that.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.wire import AveragingCounts

#: epochs in a row applied without averaging, while the run has other workers, before the warning
DEFAULT_APART_EPOCHS = 5


@dataclass
class ApartWatch:
    """Counts this worker's local epochs since its last averaged one; see the module docstring."""

    min_epochs: int = DEFAULT_APART_EPOCHS
    _last: AveragingCounts | None = None
    _streak: int = 0
    _warned: bool = False

    def update(self, counts: AveragingCounts | None, live_workers: int) -> str | None:
        """Take the latest counts; a message to log (warning) when this worker's state changed, else None."""
        if counts is None:
            return None
        last, self._last = self._last or AveragingCounts(), counts
        if counts.averaged > last.averaged:
            self._streak = 0
            if self._warned:
                self._warned = False
                return "averaging again: this worker's latest epoch was averaged with its peers"
            return None
        self._streak += max(0, counts.local - last.local)
        if self._warned or self._streak < self.min_epochs or live_workers < 2:
            return None
        self._warned = True
        return (
            f"training alone: the last {self._streak} epochs were applied on this worker's own gradients "
            f"(outcomes so far: {_outcomes(counts)}) while the run has {live_workers} live workers: "
            "its peers do not average with this one, so it trains a model of its own"
        )


def _outcomes(counts: AveragingCounts) -> str:
    fields = ("averaged", "alone", "no_group", "timeout", "failed", "downloaded")
    return ", ".join(f"{name} {getattr(counts, name)}" for name in fields if getattr(counts, name))
