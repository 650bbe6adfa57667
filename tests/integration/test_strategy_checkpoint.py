"""Checkpoints carry hivemind's optimizer state and swarm epoch: a resumed peer rejoins at that epoch.
Resumes go through the agent's ``training.fit`` (``weights_only=True``), so that state must load as
plain tensors and values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from tests.support.strategy import digits, flat_params, make_strategy, make_trainer
from worker.agent import training
from worker.examples.digits import DigitsModule

pytestmark = pytest.mark.timeout(120)  # a lone peer: it runs in the other lane (tests/support/lanes.py)


class ScheduledDigits(DigitsModule):
    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(self.parameters(), lr=self.lr)
        return {
            "optimizer": optimizer,
            "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5),
        }


class AtTrainStart(Callback):
    """What the peer holds when training (re)starts, after Lightning restored the checkpoint."""

    def on_train_start(self, trainer: Trainer, module: LightningModule) -> None:
        optimizer = trainer.optimizers[0]
        self.epoch = optimizer.local_epoch
        self.lr = optimizer.param_groups[0]["lr"]
        self.params = flat_params(module)
        self.exp_avg = optimizer.state_dict()["state"][0]["exp_avg"].clone()


def test_checkpoint_round_trip_restores_swarm_epoch_optimizer_state_and_schedule(tmp_path: Path) -> None:
    first = make_strategy(target_batch_size=32)  # one swarm epoch per local step
    trainer = make_trainer(first, max_steps=4)
    module = ScheduledDigits()
    trainer.fit(module, digits(batch_size=32))
    saved_epoch = first.optimizer.local_epoch
    assert saved_epoch == 4
    path = tmp_path / "peer.ckpt"
    trainer.save_checkpoint(path)
    saved_lr = first.optimizer.param_groups[0]["lr"]
    saved_exp_avg = first.optimizer.state_dict()["state"][0]["exp_avg"].clone()
    checkpoint = torch.load(path, weights_only=False)
    assert checkpoint["optimizer_states"][0]["state"]["local_epoch"] == saved_epoch

    probe = AtTrainStart()
    resumed = make_strategy(target_batch_size=32)  # nobody else alive: it restarts the swarm from the file
    trainer = make_trainer(resumed, callbacks=[probe], max_steps=7)
    training.fit(
        trainer, ScheduledDigits(), digits(batch_size=32), str(path)
    )  # the agent's way: weights only
    assert probe.epoch == saved_epoch
    assert probe.lr == pytest.approx(saved_lr) and saved_lr == pytest.approx(module.lr * 0.5**saved_epoch)
    assert torch.equal(probe.params, flat_params(module))
    assert torch.equal(probe.exp_avg, saved_exp_avg)
    assert resumed.optimizer.local_epoch == saved_epoch + 3  # and the swarm epoch goes on from there
    assert resumed.swarm_progress().epoch == resumed.optimizer.local_epoch


def test_hivemind_owned_scheduler_is_saved_and_restored(tmp_path: Path) -> None:
    def step_lr(optimizer: torch.optim.Optimizer) -> Any:
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)

    first = make_strategy(target_batch_size=32, scheduler_fn=step_lr)
    trainer = make_trainer(first, max_steps=6)
    trainer.fit(DigitsModule(lr=0.1), digits(batch_size=32))
    path = tmp_path / "peer.ckpt"
    trainer.save_checkpoint(path)
    saved = first.optimizer.state_averager.scheduler.state_dict()

    resumed = make_strategy(target_batch_size=32, scheduler_fn=step_lr)
    trainer = make_trainer(resumed, max_steps=6)  # already reached: restores, then stops at once
    training.fit(trainer, DigitsModule(lr=0.1), digits(batch_size=32), str(path))
    restored = resumed.optimizer.state_averager.scheduler.state_dict()
    assert restored["last_epoch"] == saved["last_epoch"] == 6
    assert resumed.optimizer.local_epoch == 6
