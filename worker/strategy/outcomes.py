"""What became of each swarm epoch on this peer: averaged with N peers, applied locally (and why), or
caught up by downloading the swarm's state.

hivemind 1.1.12 only logs these (``Averaged gradients with N peers``, ``Skipping pre-scheduled averaging
round``, ``Averaging gradients failed``...), so a run whose peers all train alone looks, from the outside,
like one that trains together. :func:`count_outcomes` wraps, on one ``hivemind.Optimizer``, the three
methods where an epoch's fate is decided, counting outcomes instead of parsing log text:

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


class OutcomeRecorder:
    """Counts each swarm epoch's outcome of one ``hivemind.Optimizer`` (see :func:`count_outcomes`)."""

    def __init__(self, optimizer: hivemind.Optimizer) -> None:
        self.counter = OutcomeCounter()
        self._optimizer = optimizer
        self._recorded = False
        self._training = False
        self._update_global_epoch = optimizer._update_global_epoch
        self._average = optimizer._average_gradients_and_load_into_optimizer
        self._load_state = optimizer.load_state_from_peers

    def update_global_epoch(self, grad_scaler: Any) -> None:
        optimizer = self._optimizer
        peers_before = optimizer.tracker.global_progress.num_peers
        self._recorded = False
        self._update_global_epoch(grad_scaler)
        if not self._recorded and not optimizer.delay_grad_averaging:
            # no round was run: hivemind applied this peer's own gradients
            self.counter.add(Outcome.alone if peers_before <= 1 else Outcome.failed)

    def average_gradients(self, maybe_step_control: Any) -> None:
        self._average(maybe_step_control)
        outcome, group_size = round_outcome(maybe_step_control)
        self.counter.add(outcome, group_size)
        self._recorded = True

    def load_state_from_peers(self, **kwargs: Any) -> None:
        epoch = self._optimizer.local_epoch
        self._load_state(**kwargs)
        if self._training and self._optimizer.local_epoch > epoch:
            self.counter.add(Outcome.downloaded)

    def start_counting_downloads(self) -> None:
        """From now on a state download is an outcome (the download that joins a swarm is not)."""
        self._training = True


def count_outcomes(optimizer: hivemind.Optimizer) -> OutcomeRecorder:
    """Wrap, on this instance only, the three methods of hivemind 1.1.12's ``Optimizer`` where an epoch's
    fate is decided. The optimizer stays a plain ``hivemind.Optimizer`` (Lightning names its learning-rate
    metrics after the class: ``lr-Optimizer``)."""
    recorder = OutcomeRecorder(optimizer)
    optimizer._update_global_epoch = recorder.update_global_epoch
    optimizer._average_gradients_and_load_into_optimizer = recorder.average_gradients
    optimizer.load_state_from_peers = recorder.load_state_from_peers
    return recorder
