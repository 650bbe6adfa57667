"""What became of each swarm epoch on this peer: averaged with N peers, applied locally (and why), or
caught up by downloading the swarm's state.

hivemind 1.1.12 only logs these (``Averaged gradients with N peers``, ``Skipping pre-scheduled averaging
round``, ``Averaging gradients failed``...), so a run whose peers all train alone looks, from the outside,
like one that trains together. :class:`OutcomeOptimizer` is ``hivemind.Optimizer`` with the three
methods where an epoch's fate is decided wrapped, counting outcomes instead of parsing log text:

- ``_update_global_epoch``: one call per swarm epoch this peer steps through;
- ``_average_gradients_and_load_into_optimizer``: its step control tells averaged (the group's size),
  timed out, no group found, or failed;
- ``load_state_from_peers`` during training: this peer fell behind and downloaded the swarm's state.

Counts are cumulative (a lost heartbeat loses nothing; the orchestrator takes differences over a window).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from enum import Enum
from typing import Any

import hivemind

from worker.wire import AveragingCounts


class Outcome(str, Enum):
    averaged = "averaged"
    alone = "alone"  # no other peer in the swarm: local gradients
    no_group = "no_group"  # peers exist, none joined this round in time
    timeout = "timeout"  # the round did not finish within averaging_timeout
    failed = "failed"  # the round broke (a peer left mid-round, an internal error)
    downloaded = "downloaded"  # behind the swarm: its state was downloaded


class OutcomeCounter:
    """Thread-safe cumulative counts by outcome, plus the sum of averaged groups' sizes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(Outcome, 0)
        self._group_sizes = 0

    def add(self, outcome: Outcome, group_size: int = 0) -> None:
        with self._lock:
            self._counts[outcome] += 1
            self._group_sizes += group_size

    def snapshot(self) -> AveragingCounts:
        with self._lock:
            counts = {outcome.value: n for outcome, n in self._counts.items()}
            return AveragingCounts(**counts, group_size_sum=self._group_sizes)


def round_outcome(control: Any) -> tuple[Outcome, int]:
    """The outcome of an averaging round from its step control, once hivemind is done waiting on it."""
    if control is None:
        return Outcome.alone, 0
    if not control.done():
        return Outcome.timeout, 0  # hivemind stopped waiting after averaging_timeout
    try:
        error = control.exception(timeout=0)
    except (concurrent.futures.CancelledError, asyncio.CancelledError):
        return Outcome.failed, 0
    if error is None:
        return Outcome.averaged, len(control.result(timeout=0))
    if isinstance(error, (TimeoutError, asyncio.TimeoutError)):
        return Outcome.timeout, 0
    if "could not find a group" in str(error):
        return Outcome.no_group, 0
    return Outcome.failed, 0


class OutcomeOptimizer(hivemind.Optimizer):  # type: ignore[misc]
    """``hivemind.Optimizer`` that counts each swarm epoch's outcome in ``outcomes``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.outcomes = OutcomeCounter()
        self._epoch_outcome: threading.local = threading.local()
        self._training = False
        super().__init__(*args, **kwargs)

    def _update_global_epoch(self, grad_scaler: Any) -> None:
        peers_before = self.tracker.global_progress.num_peers
        self._epoch_outcome.recorded = False
        super()._update_global_epoch(grad_scaler)
        if not self._epoch_outcome.recorded and not self.delay_grad_averaging:
            # no round was run: hivemind applied this peer's own gradients
            self.outcomes.add(Outcome.alone if peers_before <= 1 else Outcome.failed)

    def _average_gradients_and_load_into_optimizer(self, maybe_step_control: Any) -> None:
        super()._average_gradients_and_load_into_optimizer(maybe_step_control)
        outcome, group_size = round_outcome(maybe_step_control)
        self.outcomes.add(outcome, group_size)
        self._epoch_outcome.recorded = True

    def load_state_from_peers(self, **kwargs: Any) -> None:
        epoch = self.local_epoch
        super().load_state_from_peers(**kwargs)
        if self._training and self.local_epoch > epoch:
            self.outcomes.add(Outcome.downloaded)

    def start_counting_downloads(self) -> None:
        """From now on a state download is an outcome (the download that joins a swarm is not)."""
        self._training = True
