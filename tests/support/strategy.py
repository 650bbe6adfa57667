"""Small real training runs for the HivemindStrategy tests: one peer, its own DHT on 127.0.0.1.

A lone peer is a complete swarm: every ``target_batch_size`` samples it steps, so swarm epochs pass
in milliseconds and no averaging round waits on anyone. hivemind may also end an epoch *early*,
when its time estimate says the swarm should have the samples by now (a slow step on a busy machine
looks like that), so tests that count epochs exactly use ``target_batch_size == batch_size``.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

from worker.examples.digits import DigitsDataModule, DigitsModule
from worker.protocol.trainer import NO_VALIDATION, QUIET
from worker.strategy import HivemindStrategy

FAST_SWARM: dict[str, Any] = dict(
    host_maddrs=["/ip4/127.0.0.1/tcp/0"],
    matchmaking_time=1.0,
    averaging_timeout=10.0,
)


def make_strategy(target_batch_size: int = 64, **kwargs: Any) -> HivemindStrategy:
    """A strategy for a lone, fast swarm (options overridable)."""
    return HivemindStrategy(target_batch_size=target_batch_size, **{**FAST_SWARM, **kwargs})


def make_trainer(
    strategy: HivemindStrategy, callbacks: list[Callback] | None = None, **kwargs: Any
) -> Trainer:
    """A quiet CPU trainer for ``strategy``; ``max_steps`` defaults to 12 local steps."""
    options: dict[str, Any] = {"accelerator": "cpu", "max_steps": 12, **QUIET, **NO_VALIDATION}
    options.update(kwargs)
    return Trainer(strategy=strategy, callbacks=callbacks or [], **options)


def digits(batch_size: int = 32) -> DigitsDataModule:
    return DigitsDataModule(batch_size=batch_size)


def fixed_loader(batch_size: int | None = 32, num_samples: int = 256) -> DataLoader:
    """The first ``num_samples`` digits in a fixed order (no shuffling): identical runs see identical data."""
    module = DigitsDataModule()
    module.setup()
    assert module.train_set is not None
    features, labels = module.train_set.tensors
    dataset = TensorDataset(features[:num_samples], labels[:num_samples])
    return DataLoader(dataset, batch_size=batch_size, shuffle=False)


class SGDDigits(DigitsModule):
    """Digits with plain SGD: its update is proportional to the gradient, so a mis-scaled gradient shows."""

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class Recorder(Callback):
    """Remembers what the tests ask about during a fit."""

    def __init__(self) -> None:
        self.epochs_at_start: list[int] = []
        self.lrs: list[tuple[int, float]] = []  # (swarm epoch, lr) after each local step

    def on_train_start(self, trainer: Trainer, module: LightningModule) -> None:
        self.epochs_at_start.append(trainer.strategy.optimizer.local_epoch)  # type: ignore[attr-defined]

    def on_train_batch_end(self, trainer: Trainer, module: LightningModule, *args: Any) -> None:
        optimizer = trainer.optimizers[0]
        self.lrs.append((optimizer.local_epoch, optimizer.param_groups[0]["lr"]))


def flat_params(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in module.parameters()])
