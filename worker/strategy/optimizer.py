"""The ``hivemind.Optimizer`` behind ``HivemindStrategy``: building it, its schedulers, its checkpoints.

Lightning hands over the optimizer (and schedulers) from ``configure_optimizers``; hivemind wraps that
optimizer, or, for offloading and delayed updates, rebuilds it from the same class, defaults and
parameter groups. Schedulers from ``configure_optimizers`` follow the swarm epoch
(``SwarmEpochScheduler``); ``scheduler_fn`` is stepped by hivemind itself.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import hivemind
import torch
from hivemind.averaging import DecentralizedAverager
from hivemind.averaging.control import StepControl
from hivemind.optim.state_averager import TrainingStateAverager
from lightning.pytorch import LightningModule
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.utilities.types import LRSchedulerConfig

from worker import _hivemind_compat
from worker._hivemind_compat import expose_defaults
from worker.protocol.checkpoints import HIVEMIND_SCHEDULER_KEY
from worker.strategy.checks import warn_if_zero_grad_overridden
from worker.strategy.schedulers import SwarmEpochScheduler
from worker.strategy.shutdown import cancel_if_looking
from worker.strategy.tracker import SwarmBatchTracker

_SCHEDULER_STATE_KEY = HIVEMIND_SCHEDULER_KEY
#: what each peer sends its gradient round's groupmates: the epoch it enters after the round
NEXT_EPOCH_KEY = "next_epoch"
log = logging.getLogger(__name__)


def build_hivemind_optimizer(
    torch_optimizer: torch.optim.Optimizer, *, hivemind_creates_optimizer: bool, **hivemind_kwargs: Any
) -> Optimizer:
    """Wrap ``torch_optimizer``; or, if hivemind must own it (offload/delays), rebuild it inside hivemind."""
    _hivemind_compat.install()  # before hivemind forks its averagers
    if not hivemind_creates_optimizer:
        return expose_defaults(Optimizer(optimizer=torch_optimizer, **hivemind_kwargs))
    optimizer_class, defaults = type(torch_optimizer), dict(torch_optimizer.defaults)
    groups = [dict(group) for group in torch_optimizer.param_groups]
    return expose_defaults(
        Optimizer(
            optimizer=lambda params: optimizer_class(params, **defaults), params=groups, **hivemind_kwargs
        )
    )


class Optimizer(hivemind.Optimizer):
    """``hivemind.Optimizer`` whose epochs end on the swarm's samples counted at every step
    (:class:`~worker.strategy.tracker.SwarmBatchTracker`); otherwise hivemind's, unchanged.

    Named like its base on purpose: Lightning names learning-rate metrics after the optimizer's class
    (``lr-Optimizer``, as with lightning-hivemind), and ``isinstance(..., hivemind.Optimizer)`` holds.
    """

    def __init__(self, *args: Any, averager_opts: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self._gradient_averager_opts = dict(averager_opts or {})
        #: epochs skipped by taking a groupmate's epoch (see ``_average_gradients_and_load_into_optimizer``)
        self.epochs_caught_up = 0
        self._leaving = False
        super().__init__(*args, averager_opts=averager_opts, **kwargs)

    def _make_gradient_averager(self, factory: Any, **kwargs: Any) -> Any:
        """hivemind 1.1.12 gives ``averager_opts`` to its state averager only, although its docstring says
        both averagers get them (no upstream issue found): the gradient averager gets them too, so a
        ``request_timeout`` below the matchmaking time reaches the averager whose rounds every epoch
        waits for. ``tests/integration/test_strategy_parity.py`` checks that hivemind's warning is gone.

        Each gradient round also tells the groupmates the epoch this peer enters after it
        (:func:`group_next_epoch`)."""
        averager = super()._make_gradient_averager(factory, **{**self._gradient_averager_opts, **kwargs})
        schedule_step = averager.schedule_step

        def schedule_step_telling_next_epoch(*args: Any, **step_kwargs: Any) -> Any:
            if step_kwargs.get("gather") is None:
                step_kwargs["gather"] = {NEXT_EPOCH_KEY: self.local_epoch + 1}
            return schedule_step(*args, **step_kwargs)

        averager.schedule_step = schedule_step_telling_next_epoch
        return averager

    def _make_state_averager(self, **kwargs: Any) -> TrainingStateAverager:
        """hivemind's state averager, made a :class:`StateAverager` so that :meth:`leave_rounds` sees the
        state rounds it starts itself."""
        averager = super()._make_state_averager(**kwargs)
        averager.__class__ = StateAverager  # adds one method and no state: the process runs as it was
        return averager

    def _average_gradients_and_load_into_optimizer(self, maybe_step_control: Any) -> None:
        """hivemind 1.1.12 lets a peer one epoch behind the swarm average with it (it does not download
        the state for one epoch), and both then step: the two stay one epoch apart for as long as they
        average together, since a round does not compare epochs. Their parameters agree; their epoch
        numbers do not, so ``average_state_every`` (due when the epoch a peer enters is a multiple) sends
        one into a state round and the other into the next gradient round, and each waits out
        ``averaging_timeout`` alone. After a gradient round, a peer one behind a groupmate takes that
        groupmate's epoch, as hivemind's own catch-up does when it sees the swarm one epoch ahead."""
        super()._average_gradients_and_load_into_optimizer(maybe_step_control)
        if self.delay_grad_averaging:
            return  # then this runs in the state averager's thread, beside the epoch's own update
        ahead = group_next_epoch(maybe_step_control)
        if ahead is not None and ahead == self.local_epoch + 2:
            log.info(
                "a groupmate enters epoch %d: leaving epoch %d for %d, as it does",
                ahead,
                self.local_epoch,
                ahead - 1,
            )
            self.state_averager.local_epoch = ahead - 1
            self.epochs_caught_up += 1

    def leave_rounds(self) -> None:
        """This peer is leaving (called from any thread): it schedules and starts no more averaging
        rounds, and a round its trainer already waits in stops looking for a group now, where it would
        wait up to ``averaging_timeout`` for peers that may be leaving too; its own gradients then apply.
        A round already averaging runs to its end, so a groupmate that stays loses nothing."""
        self._leaving = True
        for control in (self.scheduled_grads, self.scheduled_state, self.state_averager.last_round):
            # only a round the trainer waits in (triggered): one it has not reached yet, hivemind itself
            # cancels and replaces by this peer's own gradients once the tracker counts it alone
            if control is not None and not control.done() and control.triggered:
                cancel_if_looking(control)
        self.tracker.count_alone()

    def _maybe_schedule_gradient_averaging(self) -> None:
        if not self._leaving:
            super()._maybe_schedule_gradient_averaging()

    def _maybe_schedule_state_averaging(self) -> None:
        if not self._leaving:
            super()._maybe_schedule_state_averaging()

    def _make_progress_tracker(self, target_batch_size: int, **kwargs: Any) -> SwarmBatchTracker:
        return SwarmBatchTracker(
            dht=self.dht,
            prefix=self.run_id,
            target_batch_size=target_batch_size,
            client_mode=self.client_mode,
            status_loglevel=self.status_loglevel,
            start=True,
            **kwargs,
        )


class _RoundRecorder(DecentralizedAverager):
    """Keeps the control of the last round its subclass's own code started with ``super().step``."""

    last_round: StepControl | None = None

    def step(self, *args: Any, **kwargs: Any) -> Any:
        control = super().step(*args, **kwargs)
        if isinstance(control, StepControl):
            self.last_round = control
        return control


class StateAverager(TrainingStateAverager, _RoundRecorder):
    """hivemind 1.1.12's ``TrainingStateAverager`` with the control of its last round kept
    (``last_round``). A state round that was not scheduled ahead (the usual case when it is due at the
    epoch that just began) is started inside the averager's background step and held nowhere else, so a
    peer told to leave could not cancel it and waited out ``averaging_timeout`` in it, past its stop grace
    when its groupmates were gone (no upstream issue found). Python's method order puts
    :class:`_RoundRecorder` between ``TrainingStateAverager`` and ``DecentralizedAverager``: the
    ``super().step`` of the former reaches it. ``tests/e2e/test_leaving_in_a_round.py`` checks it."""


def group_next_epoch(control: Any) -> int | None:
    """The highest epoch that the peers of a finished gradient round said they enter after it (None when
    the round failed or no groupmate said: a peer of another version gathers nothing)."""
    if control is None or not control.done() or control.cancelled():
        return None
    try:
        gathered = control.result(timeout=0)
    except BaseException:  # noqa: BLE001 - a failed round: hivemind has already logged why
        return None
    said = [value.get(NEXT_EPOCH_KEY) for value in (gathered or {}).values() if isinstance(value, dict)]
    epochs = [epoch for epoch in said if isinstance(epoch, int)]
    return max(epochs) if epochs else None


def follow_swarm_epochs(
    configs: list[LRSchedulerConfig],
    optimizer: hivemind.Optimizer,
    scheduler_fn: Callable[..., Any] | None,
    hivemind_creates_optimizer: bool,
) -> list[LRSchedulerConfig]:
    """The scheduler configs Lightning should keep: each scheduler wrapped to step per swarm epoch.

    Warns and drops them when they cannot or should not drive the optimizer (see the messages).
    """
    if not configs:
        return []
    if scheduler_fn is not None:
        warnings.warn(
            "HivemindStrategy(scheduler_fn=...) is given, so the schedulers returned by "
            "configure_optimizers are ignored (hivemind steps scheduler_fn once per swarm epoch).",
            UserWarning,
            stacklevel=3,
        )
        return []
    if hivemind_creates_optimizer:
        warnings.warn(
            "HivemindStrategy: with offload_optimizer or delay_optimizer_step/delay_grad_averaging, "
            "hivemind creates its own optimizer, so the schedulers returned by configure_optimizers "
            "cannot drive it and are ignored. scheduler_fn is required for a schedule: pass "
            "scheduler_fn=lambda optimizer: YourScheduler(optimizer, ...).",
            UserWarning,
            stacklevel=3,
        )
        return []
    return [
        replace(config, scheduler=SwarmEpochScheduler(config.scheduler, lambda: optimizer.local_epoch))  # type: ignore[arg-type]
        for config in configs
    ]


class SwarmLightningOptimizer(LightningOptimizer):
    """Lightning's optimizer wrapper, minus the finalizer it would inherit from ``hivemind.Optimizer``.

    Lightning's wrapper subclasses the wrapped optimizer's class, so when Lightning replaces a wrapper
    (it does, during setup) the garbage-collected wrapper runs ``hivemind.Optimizer.__del__``, which
    shuts down the *shared* averagers and leaves training hanging at its first swarm step.
    ``HivemindStrategy.teardown`` shuts the optimizer down instead.
    """

    def __del__(self) -> None:
        pass


def hivemind_state_dict(optimizer: hivemind.Optimizer) -> dict[str, Any]:
    """Optimizer statistics, ``local_epoch`` (inside ``state``) and hivemind's own scheduler, if any."""
    state = optimizer.state_dict()
    if optimizer.state_averager.scheduler is not None:
        state[_SCHEDULER_STATE_KEY] = optimizer.state_averager.scheduler.state_dict()
    return state


def load_hivemind_state_dict(optimizer: hivemind.Optimizer, saved: Mapping[str, Any]) -> None:
    """Load ``hivemind_state_dict`` output, then tell the swarm which epoch this peer is at."""
    saved = dict(saved, state=dict(saved["state"]))  # hivemind pops local_epoch from "state"
    scheduler_state = saved.pop(_SCHEDULER_STATE_KEY, None)
    optimizer.load_state_dict(saved)  # torch moves the state onto each parameter's device
    if scheduler_state is not None and optimizer.state_averager.scheduler is not None:
        optimizer.state_averager.scheduler.load_state_dict(scheduler_state)
    announce_epoch(optimizer)


def announce_epoch(optimizer: hivemind.Optimizer) -> None:
    """Report ``local_epoch`` to the swarm and offer this state to newcomers at that priority."""
    epoch = optimizer.local_epoch
    with optimizer.tracker.pause_updates():
        # the tracker's view of the swarm moves to this epoch at once (unless the swarm is ahead),
        # instead of at its next refresh, seconds later, with every local step wasted meanwhile
        optimizer.tracker.update_epoch(new_epoch=epoch)
    if not optimizer.state_averager.client_mode:
        optimizer.state_averager.state_sharing_priority = epoch
        if optimizer.grad_averager is not None:
            optimizer.grad_averager.state_sharing_priority = epoch


class ZeroGradSwitch:
    """Turns a module's ``optimizer_zero_grad`` into a no-op for one fit (``reuse_grad_buffers=True``).

    hivemind then owns the ``.grad`` buffers: it accumulates in them and clears them after each swarm
    step, and raises if anyone else zeroes them. ``restore`` puts back what the module had.
    """

    _ABSENT = object()

    def __init__(self) -> None:
        self._module: LightningModule | None = None
        self._saved: object = self._ABSENT

    def disable(self, module: LightningModule) -> None:
        """Warn if the module overrides ``optimizer_zero_grad``, then skip it until ``restore``."""
        warn_if_zero_grad_overridden(module)
        self._module = module
        self._saved = module.__dict__.get("optimizer_zero_grad", self._ABSENT)
        module.optimizer_zero_grad = _keep_gradients  # type: ignore[method-assign]

    def restore(self) -> None:
        """Undo ``disable`` (no-op if it was not called)."""
        module, self._module = self._module, None
        if module is None:
            return
        if self._saved is self._ABSENT:
            module.__dict__.pop("optimizer_zero_grad", None)
        else:
            module.__dict__["optimizer_zero_grad"] = self._saved
        self._saved = self._ABSENT


def _keep_gradients(*args: Any, **kwargs: Any) -> None:
    """Stands in for ``optimizer_zero_grad`` while hivemind owns the gradient buffers."""
