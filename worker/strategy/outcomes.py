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

With ``use_local_updates`` (``sync="local"``) no gradient round runs: the peers average their parameters
in a state round every ``average_state_every`` epochs, so the state averager's ``_do`` is wrapped as well,
to hold that round's step control, and an epoch's outcome is its state round's. An epoch without a state
round is ``alone`` when this peer saw no other, and not counted when it had peers: training apart
between rounds is what the mode asks for, not a round that failed.

Counts are cumulative (a lost heartbeat loses nothing; the orchestrator takes differences over a window),
and so are the seconds beside them: since training started, and of those, blocked in averaging (the
whole epoch transition here; a DiLoCo round in ``worker/strategy/diloco/optimizer.py``). Their ratio is
the run's G, compute per round over the round's cost, and the share of time workers wait.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable
from enum import Enum
from typing import Any

import hivemind
from hivemind.averaging.control import StepControl
from hivemind.optim.state_averager import TrainingStateAverager

from worker.protocol.workers import AveragingCounts


class Outcome(str, Enum):
    averaged = "averaged"
    alone = "alone"  # no other peer in the swarm: local gradients
    no_group = "no_group"  # peers exist, none joined this round in time
    timeout = "timeout"  # the round did not finish within averaging_timeout
    failed = "failed"  # the round broke (a peer left mid-round, an internal error)
    downloaded = "downloaded"  # behind the swarm: its state was downloaded


class OutcomeCounter:
    """Thread-safe cumulative counts by outcome, plus the sum of averaged groups' sizes, the seconds since
    training started (:meth:`start`) and the seconds of those blocked in averaging (:meth:`add_blocked`)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._counts = dict.fromkeys(Outcome, 0)
        self._group_sizes = 0
        self._started_at: float | None = None
        self._blocked_s = 0.0
        self._kept_samples = 0

    def add(self, outcome: Outcome, group_size: int = 0) -> None:
        with self._lock:
            self._counts[outcome] += 1
            self._group_sizes += group_size

    def start(self) -> None:
        """Training starts now (the first call counts): ``train_s`` runs from here."""
        with self._lock:
            if self._started_at is None:
                self._started_at = self._clock()

    def add_blocked(self, seconds: float) -> None:
        """The training thread waited ``seconds`` on averaging (a round, an epoch's transition)."""
        with self._lock:
            if self._started_at is not None:
                self._blocked_s += max(0.0, seconds)

    def add_kept(self, samples: int) -> None:
        """``samples`` of this peer went into the model: a DiLoCo round applied them with their weight."""
        with self._lock:
            self._kept_samples += max(0, samples)

    def snapshot(self) -> AveragingCounts:
        with self._lock:
            counts = {outcome.value: n for outcome, n in self._counts.items()}
            train_s = 0.0 if self._started_at is None else max(0.0, self._clock() - self._started_at)
            return AveragingCounts(
                **counts,
                group_size_sum=self._group_sizes,
                train_s=round(train_s, 3),
                averaging_s=round(min(self._blocked_s, train_s), 3),
                kept_samples=self._kept_samples,
            )


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
        self._do_state_step = optimizer.state_averager._do
        self._state_control: StepControl | None = None

    def update_global_epoch(self, grad_scaler: Any) -> None:
        optimizer = self._optimizer
        peers_before = optimizer.tracker.global_progress.num_peers
        self._recorded = False
        self._state_control = None
        started = time.monotonic()
        self._update_global_epoch(grad_scaler)
        self.counter.add_blocked(time.monotonic() - started)
        if optimizer.use_local_updates:
            self._record_state_round(peers_before)
        elif not self._recorded and not optimizer.delay_grad_averaging:
            # no round was run: hivemind applied this peer's own gradients
            self.counter.add(Outcome.alone if peers_before <= 1 else Outcome.failed)

    def _record_state_round(self, peers_before: int) -> None:
        """Local updates: the epoch's state round, if one ran (see the module docstring)."""
        control = self._state_control
        if control is None:
            if peers_before <= 1:
                self.counter.add(Outcome.alone)
        elif control.done() or not self._optimizer.delay_state_averaging:
            self.counter.add(*round_outcome(control))  # not done: hivemind stopped waiting (timeout)
        else:  # a delayed state round (delay_state_averaging): counted when it ends
            control.add_done_callback(lambda done: self.counter.add(*round_outcome(done)))

    def do_state_step(self, *args: Any, **kwargs: Any) -> Any:
        """``TrainingStateAverager._do``, given the round's step control made here (where hivemind would
        make it, with the same arguments) so that its outcome can be read (hivemind drops it)."""
        wait_for_trigger, optimizer_step, zero_grad, averaging_round, control, *rest = args
        if averaging_round:
            if control is None or control.triggered or control.done():
                averager = self._optimizer.state_averager
                # the step after TrainingStateAverager's in the method order, as hivemind's own ``_do``
                # calls it: our StateAverager records the round there (``last_round``), so that a peer
                # told to leave can cancel it (``Optimizer.leave_rounds``)
                next_step = super(TrainingStateAverager, averager).step  # type: ignore[misc]
                control = next_step(
                    gather=averager.local_epoch,
                    require_trigger=True,
                    timeout=kwargs.get("timeout"),
                    wait=False,
                    **{key: value for key, value in kwargs.items() if key != "timeout"},
                )
            self._state_control = control
        return self._do_state_step(
            wait_for_trigger, optimizer_step, zero_grad, averaging_round, control, *rest, **kwargs
        )

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
        """From now on a state download is an outcome (the download that joins a swarm is not), and
        training time counts."""
        self._training = True
        self.counter.start()


def count_outcomes(optimizer: hivemind.Optimizer) -> OutcomeRecorder:
    """Wrap, on this instance only, the three methods of hivemind 1.1.12's ``Optimizer`` where an epoch's
    fate is decided, and its state averager's ``_do`` (where a state round runs). The optimizer stays a
    plain ``hivemind.Optimizer`` (Lightning names its learning-rate metrics after the class:
    ``lr-Optimizer``)."""
    recorder = OutcomeRecorder(optimizer)
    optimizer._update_global_epoch = recorder.update_global_epoch
    optimizer._average_gradients_and_load_into_optimizer = recorder.average_gradients
    optimizer.load_state_from_peers = recorder.load_state_from_peers
    optimizer.state_averager._do = recorder.do_state_step
    return recorder
