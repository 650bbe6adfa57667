"""The optimizer Lightning steps in DiLoCo mode: the module's own optimizer every batch, a round when due.

:class:`DiLoCoOptimizer` wraps the torch optimizer from ``configure_optimizers`` (the inner optimizer,
stepped with the user's schedulers as Lightning steps them) and, when the round schedule says so, runs a
round: this peer's pseudo-gradient goes into hivemind's weighted all-reduce (:mod:`.averager`) and the
outer step applies the group's mean (:mod:`.outer`). What becomes of a round:

- ``averaged``: the outer step with the group's mean; the epoch (the round counter) becomes one past the
  highest epoch in the group; a peer that was behind the group then downloads the global state;
- ``alone``: no other peer in the swarm: the outer step with this peer's own pseudo-gradient;
- ``no_group``: peers exist but none met this peer in the round's window: nothing changes, the local
  weights train on and the next round's pseudo-gradient covers both periods (nothing is lost, and the
  global weights stay those the others hold unless they stepped without it, in which case the next
  round finds the swarm ahead and downloads its state);
- ``failed`` or ``timeout``: the round broke after its group formed: it is discarded and the local
  weights go back to the global copy, so that no peer keeps a half-applied round.

A peer that joins a swarm (or finds it ahead) downloads the global weights, the outer optimizer's
momentum and the epoch from a peer, and weighs 0 in its next round: it computed that round's samples
from other weights than the group's. A group of joiners only (the last peer that had trained in the
swarm died as they joined) has no weight at all: its round is discarded like a failed one, which puts
them all back on the global weights they downloaded, and they weigh their samples from the next round.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from hivemind import DHT
from hivemind.averaging.control import AveragingStage, StepControl
from hivemind.compression import CompressionBase
from hivemind.utils import get_dht_time

from worker import _hivemind_compat
from worker._hivemind_compat import quiet_abandoned_event_loops
from worker.protocol.checkpoints import DILOCO_STATE_KEY, LOCAL_EPOCH_KEY
from worker.strategy.diloco.averager import EPOCH_KEY, STEPPED_KEY, DiLoCoAverager
from worker.strategy.diloco.outer import OuterStep
from worker.strategy.diloco.schedule import RoundSchedule
from worker.strategy.diloco.settings import DiLoCoSettings, round_matchmaking_s
from worker.strategy.outcomes import Outcome, OutcomeCounter, round_outcome
from worker.strategy.shutdown import stop_tracker_keeping_record
from worker.strategy.tracker import SwarmBatchTracker

#: this peer's local weights in the outer state of its checkpoint (beside the outer step's own keys)
LOCAL_WEIGHTS_KEY = "local_weights"
SHUTDOWN_TIMEOUT_S = 5.0
_TRACKER_JOIN_TIMEOUT_S = 10.0
log = logging.getLogger(__name__)


class DiLoCoOutcomes:
    """What the strategy reads of a round's outcomes (the interface of ``outcomes.OutcomeRecorder``)."""

    def __init__(self) -> None:
        self.counter = OutcomeCounter()
        self.counting_downloads = False

    def start_counting_downloads(self) -> None:
        """From now on a state download is an outcome (the download that joins a swarm is not), and
        training time counts."""
        self.counting_downloads = True
        self.counter.start()


class DiLoCoOptimizer(torch.optim.Optimizer):
    """The inner optimizer plus DiLoCo rounds (see the module docstring). Exposes what the strategy and
    the worker agent read of a ``hivemind.Optimizer``: ``local_epoch``, ``tracker``, ``dht``,
    ``load_state_from_peers``, ``leave_rounds``, ``is_alive``."""

    def __init__(
        self,
        inner: torch.optim.Optimizer,
        *,
        dht: DHT,
        run_id: str,
        settings: DiLoCoSettings,
        target_batch_size: int,
        matchmaking_time: float,
        averaging_timeout: float,
        averager_opts: Mapping[str, Any],
        tracker_opts: Mapping[str, Any],
        client_mode: bool = False,
        compression: CompressionBase | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        # not torch's __init__: param_groups and state are the inner optimizer's (as hivemind.Optimizer)
        self.inner = inner
        self.dht = dht
        self.run_id = run_id
        self.settings = settings
        self.matchmaking_time = matchmaking_time = round_matchmaking_s(settings, matchmaking_time)
        # hivemind's averager wants its requests to time out within the matchmaking window
        request_timeout = min(averager_opts.get("request_timeout", math.inf), matchmaking_time / 2)
        averager_opts = {**averager_opts, "request_timeout": request_timeout}
        self.averaging_timeout = averaging_timeout
        self.local_epoch = 0
        #: samples of the coming step, set by the strategy before each ``step``
        self.batch_samples = 0
        self.samples_in_round = 0
        self.outcomes = DiLoCoOutcomes()
        self.last_outcome: Outcome | None = None
        #: seconds the training thread spent blocked in rounds, and rounds run (G = compute / this)
        self.round_s_total = 0.0
        self.rounds = 0
        self._params = [p for group in inner.param_groups for p in group["params"]]
        self._zero_weight = False
        self._leaving = False
        self._control: StepControl | None = None  # the next round's, scheduled ahead
        self._control_running: StepControl | None = None  # the round being averaged
        self.outer = OuterStep(self._params, settings.outer_lr, settings.outer_momentum)
        _hivemind_compat.install()
        self.averager = DiLoCoAverager(
            self.outer,
            lambda: self.local_epoch,
            dht,
            prefix=f"{run_id}_diloco",
            compression=compression,
            min_matchmaking_time=matchmaking_time,
            allreduce_timeout=averaging_timeout,
            client_mode=client_mode,
            **dict(averager_opts),
        )
        self.tracker = SwarmBatchTracker(
            dht=dht,
            prefix=run_id,
            target_batch_size=target_batch_size,
            client_mode=client_mode,
            start=True,
            **dict(tracker_opts),
        )
        extra = {} if clock is None else {"clock": clock}
        self.schedule = RoundSchedule(settings, lead_s=matchmaking_time, **extra)

    # ------------------------------------------------------------------ torch.optim.Optimizer surface
    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.inner.param_groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.inner.state

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.inner.defaults

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(run_id={self.run_id}, epoch={self.local_epoch}, inner={self.inner!r})"

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """The inner step, then this round if it is due."""
        loss = self.inner.step(closure) if closure is not None else self.inner.step()
        self.samples_in_round += self.batch_samples
        self.schedule.count_step()
        self.tracker.report_local_progress(self.local_epoch, self.samples_in_round)
        if not self._leaving:
            if self.schedule.time_to_schedule() and self._control is None and self._has_peers():
                self._control = self._start_round(scheduled_time=self.schedule.round_at)
            if self.schedule.due():
                self.run_round()
        elif self._round_in_flight() and self.schedule.due():
            self.run_round()  # its group formed before the leave (see leave_rounds)
        return loss

    # ------------------------------------------------------------------------------------ rounds
    @property
    def next_round_at(self) -> float | None:
        """The DHT time (the wall clock) by which this peer's next round has its group: the round's
        moment plus the matchmaking time, after which the round runs or ended without a group (a leave
        from then on does not call it off, see :meth:`leave_rounds`). None when rounds come by steps or
        it leaves them."""
        if self.schedule.by_steps or self._leaving:
            return None
        return self.schedule.round_at + self.matchmaking_time

    def _has_peers(self) -> bool:
        return int(self.tracker.global_progress.num_peers) > 1

    def _start_round(self, scheduled_time: float | None = None) -> StepControl:
        """Matchmaking for a round, in the averager's process; the all-reduce waits for the trigger.

        The group forms at ``scheduled_time`` (by default a matchmaking time from now), or the round
        ends one matchmaking time later without one (``no_group``) and this peer trains on: swarm mates
        that miss the round (a joiner between two boundaries, a peer that overran) cost it at most that
        wait, not ``averaging_timeout``, which bounds the all-reduce once a group formed."""
        start = scheduled_time if scheduled_time is not None else get_dht_time() + self.matchmaking_time
        return self.averager.step(  # type: ignore[return-value]
            gather={EPOCH_KEY: self.local_epoch},
            scheduled_time=start,
            weight=0.0,
            timeout=max(0.0, start - get_dht_time()) + self.matchmaking_time,
            require_trigger=True,
            wait=False,
        )

    def run_round(self) -> Outcome:
        """Average this round's pseudo-gradients and take the outer step (see the module docstring)."""
        started = time.monotonic()
        try:
            return self._run_round()
        finally:
            took_s = time.monotonic() - started
            self.round_s_total += took_s
            self.rounds += 1
            self.outcomes.counter.add_blocked(took_s)

    def _run_round(self) -> Outcome:
        if self.tracker.global_progress.epoch > self.local_epoch and self._has_peers():
            log.info(
                "swarm %s is at round %d, this peer at %d: downloading its state",
                self.run_id,
                self.tracker.global_progress.epoch,
                self.local_epoch,
            )
            self.load_state_from_peers()
        control, self._control = self._control, None
        pseudo_gradients = self.outer.pseudo_gradients(self._params)
        weight = 0.0 if self._zero_weight else float(self.samples_in_round)
        mean, group_epochs, group_size = pseudo_gradients, [self.local_epoch], 0
        weightless = False
        if control is None and not self._has_peers():
            outcome = Outcome.alone
        else:
            # not under the tracker's pause: it would hold the lock its fetches need for the whole round
            outcome, group_size, gathered = self._average(control, pseudo_gradients, weight)
            if outcome is Outcome.averaged:
                with self.averager.get_tensors() as tensors:
                    mean = [tensor.clone() for tensor in tensors]
                # every groupmate weighed 0: the mean is 0 / 0
                weightless = not all(bool(torch.isfinite(t).all()) for t in mean)
                if weightless:
                    outcome, group_size = Outcome.failed, 0
                group_epochs += [v[EPOCH_KEY] for v in gathered.values() if isinstance(v, dict)]
        self._finish(outcome, mean, group_epochs)
        if weightless:
            # a group of joiners only: the discard put each back on the global weights all of them
            # downloaded, so this peer's next pseudo-gradient starts from the group's; weighing 0 again
            # would discard every round of theirs until a veteran joined, and the swarm would stand still
            self._zero_weight = False
        self.outcomes.counter.add(outcome, group_size)
        if outcome in (Outcome.averaged, Outcome.alone) and weight > 0:
            self.outcomes.counter.add_kept(self.samples_in_round)
        self.last_outcome = outcome
        self.schedule.next_round()
        self.samples_in_round = 0
        return outcome

    def _average(
        self, control: StepControl | None, pseudo_gradients: list[torch.Tensor], weight: float
    ) -> tuple[Outcome, int, dict[Any, Any]]:
        if control is None:
            control = self._start_round()
        self._control_running = control
        with self.averager.get_tensors() as tensors:
            for tensor, value in zip(tensors, pseudo_gradients, strict=True):
                tensor.copy_(value)
        if not control.done():
            control.weight = weight
            control.allow_allreduce()
        gathered: dict[Any, Any] = {}
        try:
            gathered = control.result(timeout=self.averaging_timeout + self.matchmaking_time) or {}
        except concurrent.futures.TimeoutError:
            control.cancel()
        except BaseException:  # noqa: BLE001 - the round's own error: classified below, hivemind logged it
            pass
        outcome, group_size = round_outcome(control)
        return outcome, group_size, gathered

    def _finish(self, outcome: Outcome, mean: list[torch.Tensor], group_epochs: list[int]) -> None:
        if outcome in (Outcome.averaged, Outcome.alone):
            self.outer.apply(mean)
            self.outer.copy_into(self._params)
            behind = max(group_epochs) > self.local_epoch
            self._set_epoch(max(group_epochs) + 1)
            self._zero_weight = False
            if behind:  # its pseudo-gradient counted, but its global weights were older than the group's
                self.load_state_from_peers()
                self._zero_weight = False
        elif outcome in (Outcome.failed, Outcome.timeout):
            log.warning(
                "round of epoch %d %s: discarded, back to the global weights", self.local_epoch, outcome.value
            )
            self.outer.copy_into(self._params)
        log.info("round of swarm %s: %s, epoch %d", self.run_id, outcome.value, self.local_epoch)

    def _set_epoch(self, epoch: int) -> None:
        self.local_epoch = epoch
        with self.tracker.pause_updates():
            self.tracker.update_epoch(new_epoch=epoch)
        if not self.averager.client_mode:
            self.averager.state_sharing_priority = epoch

    def load_state_from_peers(self, **_: Any) -> bool:
        """Take the global weights, outer momentum and epoch of the peer with the newest state; this peer
        then weighs 0 in its next round. False when no peer handed its state over."""
        try:
            loaded = self.averager.load_state_from_peers(timeout=self.averaging_timeout)
        except concurrent.futures.TimeoutError:
            loaded = None
        if loaded is None:
            return False
        metadata, tensors = loaded
        self.outer.load_state_tensors(bool(metadata[STEPPED_KEY]), tensors)
        self.outer.copy_into(self._params)
        if self.outcomes.counting_downloads:
            self.outcomes.counter.add(Outcome.downloaded)
        self._set_epoch(int(metadata[EPOCH_KEY]))
        self._zero_weight = True
        return True

    # --------------------------------------------------------------------------- leaving, state
    def leave_rounds(self) -> None:
        """Start no more rounds (a peer about to leave; any thread). A round still looking for its group
        is called off; one whose group formed is not: calling it off would break the round of every
        groupmate and throw this peer's round of training away. The training thread ends that round at
        its moment (:meth:`step`) or as it shuts down, within ``averaging_timeout``."""
        self._leaving = True
        for control in (self._control, self._control_running):
            if control is not None and not control.done() and not _group_formed(control):
                control.cancel()
        self.tracker.count_alone()

    def _round_in_flight(self) -> bool:
        """A round scheduled ahead whose group formed, not run yet."""
        return self._control is not None and not self._control.done() and _group_formed(self._control)

    def is_alive(self) -> bool:
        return bool(self.averager.is_alive())

    def shutdown(self, keep_progress: bool = False) -> None:
        """Stop the averager and the tracker; ``keep_progress`` leaves the last progress record stored."""
        if self._leaving and self._round_in_flight() and self.averager.is_alive():
            self.run_round()  # its group formed before the leave, and it stopped before the moment
        if self._control is not None and not self._control.done():
            self._control.cancel()
        if keep_progress:
            stop_tracker_keeping_record(self.tracker, SHUTDOWN_TIMEOUT_S)
        else:
            self.tracker.shutdown(SHUTDOWN_TIMEOUT_S)
        if self.averager.is_alive():
            self.averager.shutdown()
        self.tracker.join(_TRACKER_JOIN_TIMEOUT_S)
        quiet_abandoned_event_loops()  # the tracker's thread leaves pending tasks behind (hivemind 1.1.12)

    def global_weights(self) -> list[torch.Tensor]:
        """Copies of the global weights (the run's model), in the order of the inner optimizer's params."""
        with self.outer.lock:
            return [g.detach().clone() for g in self.outer.global_params]

    @property
    def params(self) -> list[torch.Tensor]:
        """The local parameters this optimizer steps, in the order of :meth:`global_weights`."""
        return list(self._params)

    def state_dict(self) -> dict[str, Any]:
        """The inner optimizer's state, the epoch in ``state`` (as hivemind's) and the outer state with
        this peer's local weights: the checkpoint's ``state_dict`` holds the global ones (the run's
        model), so a resume takes the local ones from here."""
        saved = self.inner.state_dict()
        saved["state"] = {**saved["state"], LOCAL_EPOCH_KEY: self.local_epoch}
        local = [p.detach().to("cpu", copy=True) for p in self._params]
        saved[DILOCO_STATE_KEY] = {**self.outer.state_dict(), LOCAL_WEIGHTS_KEY: local}
        return saved

    @torch.no_grad()
    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load :meth:`state_dict` output. Lightning loaded the model's weights (the global ones) first;
        the local weights saved beside the outer state replace them, so training goes on where it was."""
        saved = dict(state_dict)
        state = dict(saved["state"])
        epoch = state.pop(LOCAL_EPOCH_KEY, None)
        outer = saved.pop(DILOCO_STATE_KEY, None)
        self.inner.load_state_dict({**saved, "state": state})
        if outer is not None:
            self.outer.load_state_dict(outer)
            local = outer.get(LOCAL_WEIGHTS_KEY)  # None in a checkpoint whose state_dict was local
            for param, value in zip(self._params, local or (), strict=local is not None):
                param.copy_(value)
        if isinstance(epoch, int):
            self._set_epoch(epoch)


def _group_formed(control: StepControl) -> bool:
    """The round's group is assembled: the all-reduce waits for its trigger or runs."""
    return control.stage in (AveragingStage.AWAITING_TRIGGER, AveragingStage.RUNNING_ALLREDUCE)
