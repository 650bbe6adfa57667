"""Learning-rate schedules follow the swarm epoch: once per swarm step; a late peer lands on the swarm's."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.support.strategy import Recorder, digits, make_strategy, make_trainer
from worker.examples.digits import DigitsModule
from worker.strategy.schedulers import SwarmEpochScheduler

BASE_LR = 0.1
GAMMA = 0.5


def _step_lr(epochs: list[int]) -> tuple[torch.optim.Optimizer, SwarmEpochScheduler]:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=BASE_LR)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=GAMMA)
    return optimizer, SwarmEpochScheduler(scheduler, lambda: epochs[0])


def _lr(optimizer: torch.optim.Optimizer) -> float:
    return float(optimizer.param_groups[0]["lr"])


@pytest.mark.timeout(30)
def test_schedule_advances_once_per_swarm_epoch_however_often_it_is_stepped() -> None:
    epochs = [0]
    optimizer, scheduler = _step_lr(epochs)
    for epoch in range(1, 7):
        epochs[0] = epoch
        for _ in range(5):  # five local batches per swarm epoch
            scheduler.step()
        assert _lr(optimizer) == pytest.approx(BASE_LR * GAMMA ** (epoch // 2))
    assert scheduler.swarm_epoch == 6 and scheduler.get_last_lr() == [_lr(optimizer)]


@pytest.mark.timeout(30)
def test_a_peer_that_jumps_epochs_or_loads_a_peers_lr_gets_the_swarms_schedule() -> None:
    epochs = [0]
    optimizer, scheduler = _step_lr(epochs)
    epochs[0] = 9  # joined late: loaded epoch 9 from a peer
    scheduler.sync()
    assert _lr(optimizer) == pytest.approx(BASE_LR * GAMMA**4)
    # hivemind loads the peer's parameter groups (lr included) along with a one-epoch jump:
    # stepping the chainable StepLR on top of that would decay twice
    optimizer.param_groups[0]["lr"] = BASE_LR * GAMMA**5
    epochs[0] = 10
    scheduler.sync()
    assert _lr(optimizer) == pytest.approx(BASE_LR * GAMMA**5)


@pytest.mark.timeout(30)
def test_scheduler_state_round_trips_with_its_swarm_epoch() -> None:
    epochs = [0]
    optimizer, scheduler = _step_lr(epochs)
    epochs[0] = 5
    scheduler.step()
    state = scheduler.state_dict()

    restored_epochs = [5]
    restored_optimizer, restored = _step_lr(restored_epochs)
    restored_optimizer.param_groups[0]["lr"] = _lr(optimizer)  # Lightning restores optimizers first
    restored.load_state_dict(state)
    assert restored.swarm_epoch == 5 and _lr(restored_optimizer) == _lr(optimizer)
    restored_epochs[0] = 6
    restored.step()
    assert _lr(restored_optimizer) == pytest.approx(BASE_LR * GAMMA**3)


class StepLRDigits(DigitsModule):
    interval = "step"

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=BASE_LR)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=GAMMA)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": self.interval}}


class EpochIntervalDigits(StepLRDigits):
    interval = "epoch"


@pytest.mark.swarm
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "module_class", [StepLRDigits, EpochIntervalDigits], ids=["interval-step", "interval-epoch"]
)
def test_schedulers_from_configure_optimizers_step_per_swarm_epoch(module_class: type[StepLRDigits]) -> None:
    recorder = Recorder()
    strategy = make_strategy(target_batch_size=96)  # 3 local batches of 32 per swarm epoch
    trainer = make_trainer(strategy, callbacks=[recorder], max_steps=10)
    trainer.fit(module_class(), digits(batch_size=32))
    assert strategy.optimizer.local_epoch >= 3 and trainer.global_step == 10
    for epoch, lr in recorder.lrs:
        assert lr == pytest.approx(BASE_LR * GAMMA**epoch), recorder.lrs


@pytest.mark.swarm
@pytest.mark.timeout(120)
def test_delay_flags_without_scheduler_fn_warn_that_the_schedule_is_dropped() -> None:
    strategy = make_strategy(target_batch_size=64, offload_optimizer=True)
    with pytest.warns(UserWarning, match="scheduler_fn is required"):
        make_trainer(strategy, max_steps=4).fit(StepLRDigits(), digits())
    assert strategy.lr_scheduler_configs == []
    assert strategy.optimizer.offload_optimizer


@pytest.mark.swarm
@pytest.mark.timeout(120)
def test_scheduler_fn_is_stepped_by_hivemind_per_swarm_epoch_even_with_delays() -> None:
    recorder = Recorder()
    strategy = make_strategy(
        target_batch_size=64,
        delay_optimizer_step=True,
        delay_state_averaging=True,
        offload_optimizer=True,
        scheduler_fn=lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=GAMMA),
    )
    make_trainer(strategy, callbacks=[recorder], max_steps=8).fit(DigitsModule(lr=BASE_LR), digits())
    epoch = strategy.optimizer.local_epoch
    assert epoch >= 3
    assert strategy.optimizer.state_averager.scheduler.get_last_lr()[0] == pytest.approx(
        BASE_LR * GAMMA**epoch
    )
