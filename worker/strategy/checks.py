"""The checks ``HivemindStrategy`` runs before training starts, each failing with the fix in its message."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.core.optimizer import _MockOptimizer
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.types import LRSchedulerConfig
from torch.utils.data import DataLoader


class HivemindStrategyError(MisconfigurationException):
    """A training setup ``HivemindStrategy`` cannot run; the message says what to change."""


class SwarmNotStartedError(RuntimeError):
    """The DHT or the optimizer was asked for before ``setup`` started them (or after ``teardown``)."""


def check_constructor_args(
    target_batch_size: int,
    batch_size: int | None,
    delay_state_averaging: bool,
    delay_optimizer_step: bool | None,
    delay_grad_averaging: bool,
) -> None:
    """Reject impossible settings at construction, before any process starts."""
    if not isinstance(target_batch_size, int) or target_batch_size <= 0:
        raise HivemindStrategyError(f"target_batch_size must be a positive int, got {target_batch_size!r}")
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size <= 0):
        raise HivemindStrategyError(f"batch_size must be a positive int or None, got {batch_size!r}")
    check_delays(delay_state_averaging, delay_optimizer_step, delay_grad_averaging)


def check_delays(
    delay_state_averaging: bool, delay_optimizer_step: bool | None, delay_grad_averaging: bool
) -> None:
    """The delay flags that work together; also asked by the run's create-time check
    (``worker/strategy/options.py``), so a combination hivemind cannot run is refused before launch."""
    if delay_grad_averaging and delay_optimizer_step is False:
        raise HivemindStrategyError(
            "delay_grad_averaging=True requires delay_optimizer_step=True (or None, which follows it)"
        )
    delays_optimizer = delay_optimizer_step if delay_optimizer_step is not None else delay_grad_averaging
    if delays_optimizer and not delay_state_averaging:
        # hivemind would only fail at the first swarm step, deep in its state averager
        raise HivemindStrategyError(
            "a delayed optimizer step (delay_optimizer_step or delay_grad_averaging) needs "
            "delay_state_averaging=True: hivemind averages the state of a delayed step in the background"
        )


def check_timeouts(matchmaking_time: float, averaging_timeout: float) -> None:
    """hivemind schedules each round ``matchmaking_time`` ahead within ``averaging_timeout``: a timeout
    that does not leave room for it fails every peer's training with an AssertionError at the first
    scheduled round ("Scheduled start time does not fit within timeout")."""
    if averaging_timeout <= matchmaking_time:
        raise HivemindStrategyError(
            f"averaging_timeout ({averaging_timeout:g} s) must be longer than matchmaking_time "
            f"({matchmaking_time:g} s): a round is scheduled matchmaking_time ahead and must then finish "
            f"within averaging_timeout (a few times matchmaking_time is usual)"
        )


def warn_if_scheduler_fn_needed(
    scheduler_fn: Any,
    delay_state_averaging: bool,
    delay_optimizer_step: bool | None,
    offload_optimizer: bool | None,
) -> None:
    """Warn, as lightning-hivemind does, that a learning-rate schedule needs ``scheduler_fn`` here."""
    if scheduler_fn is None and (delay_state_averaging or delay_optimizer_step or offload_optimizer):
        warnings.warn(
            "HivemindStrategy: with delay_state_averaging, delay_optimizer_step or offload_optimizer, give "
            "a learning-rate schedule as scheduler_fn=lambda optimizer: YourScheduler(optimizer, ...): "
            "hivemind then steps it with the optimizer, once per swarm epoch, also when the step runs in "
            "the background or on an optimizer hivemind re-creates.",
            UserWarning,
            stacklevel=3,
        )


def check_trainer(trainer: Trainer, reuse_grad_buffers: bool) -> None:
    """Gradient accumulation belongs to hivemind; clipping cannot touch hivemind's accumulation buffer."""
    if trainer.accumulate_grad_batches != 1:
        raise HivemindStrategyError(
            f"HivemindStrategy accumulates gradients itself up to target_batch_size; remove "
            f"Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches}) (or set it to 1) and "
            f"raise target_batch_size instead."
        )
    if reuse_grad_buffers and trainer.gradient_clip_val:
        raise HivemindStrategyError(
            "With reuse_grad_buffers=True the .grad buffers hold gradients summed over many batches, "
            "so Trainer(gradient_clip_val=...) would clip the sum; use reuse_grad_buffers=False to clip."
        )


def single_optimizer(
    optimizers: Sequence[torch.optim.Optimizer], lr_scheduler_configs: Sequence[LRSchedulerConfig]
) -> torch.optim.Optimizer:
    """The one optimizer from ``configure_optimizers``; rejects plateau schedulers too."""
    real = [opt for opt in optimizers if not isinstance(opt, _MockOptimizer)]
    if len(real) != 1:
        raise HivemindStrategyError(
            f"HivemindStrategy trains with exactly one optimizer, but configure_optimizers returned "
            f"{len(real)}. Return a single optimizer (use parameter groups for different settings)."
        )
    for config in lr_scheduler_configs:
        if config.reduce_on_plateau:
            raise HivemindStrategyError(
                "ReduceLROnPlateau is not supported by HivemindStrategy: the learning rate must be the same "
                "on every peer at each swarm epoch, and a metric seen by one peer cannot guarantee that. "
                "Use a schedule driven by the epoch (StepLR, CosineAnnealingLR, LambdaLR, ...)."
            )
    return real[0]


def declared_batch_size(dataloaders: object) -> int:
    """Samples per step declared by the train dataloader(s); fails if they declare none."""
    if isinstance(dataloaders, DataLoader):
        size = dataloaders.batch_size
        if size is None and dataloaders.batch_sampler is not None:
            size = getattr(dataloaders.batch_sampler, "batch_size", None)
        if isinstance(size, int) and size > 0:
            return size
    elif isinstance(dataloaders, Mapping) and dataloaders:
        return sum(declared_batch_size(loader) for loader in dataloaders.values())
    elif isinstance(dataloaders, Sequence) and not isinstance(dataloaders, str) and dataloaders:
        return sum(declared_batch_size(loader) for loader in dataloaders)
    raise HivemindStrategyError(
        "HivemindStrategy could not infer the batch size from the train dataloader (it needs the number of "
        "samples per step to count progress towards target_batch_size). Pass it explicitly: "
        "HivemindStrategy(..., batch_size=<samples per step>)."
    )


def leading_dim(batch: Any) -> int | None:
    """The first dimension of the first tensor in a (nested) batch, or ``None`` if there is none."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.ndim > 0 else 1
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            size = leading_dim(item)
            if size is not None:
                return size
    return None


def warn_if_zero_grad_overridden(module: LightningModule) -> None:
    """With reuse_grad_buffers=True hivemind owns ``.grad``: a custom ``optimizer_zero_grad`` is skipped."""
    if is_overridden("optimizer_zero_grad", module):
        warnings.warn(
            f"HivemindStrategy(reuse_grad_buffers=True): {type(module).__name__}.optimizer_zero_grad will "
            f"not be called during fit, because hivemind accumulates gradients in the .grad buffers and "
            f"clears them itself after each swarm step. It is restored when fit ends.",
            UserWarning,
            stacklevel=2,
        )
