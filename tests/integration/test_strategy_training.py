"""A lone peer trains through HivemindStrategy: the optimizer, metrics, batch sizes, zero_grad, teardown."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import hivemind
import pytest
import torch

from tests.support.strategy import digits, fixed_loader, make_strategy, make_trainer
from worker.examples.digits import DigitsModule
from worker.strategy import HivemindStrategyError, SwarmNotStartedError
from worker.strategy.dht import start_dht

pytestmark = pytest.mark.timeout(120)  # a lone peer: it runs in the other lane (tests/support/lanes.py)


def test_a_lone_peer_trains_with_hivemind_optimizer_and_logs_swarm_metrics(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="worker.strategy")
    strategy = make_strategy(target_batch_size=32)  # one swarm epoch per local step
    trainer = make_trainer(strategy, max_steps=12)
    module = DigitsModule()
    trainer.fit(module, digits(batch_size=32))

    optimizer = trainer.optimizers[0]
    # hivemind's optimizer (our subclass keeps its name: Lightning names lr metrics after the class)
    assert isinstance(optimizer, hivemind.Optimizer) and type(optimizer).__name__ == "Optimizer"
    assert strategy.optimizer is optimizer
    assert optimizer.local_epoch == 12
    assert strategy.local_samples == 12 * 32
    progress = strategy.swarm_progress()  # after fit: the last view of the swarm
    assert progress.epoch == optimizer.local_epoch and progress.target_batch_size == 32
    for key in ("swarm/peers", "swarm/epoch", "swarm/samples_per_s", "swarm/local_samples"):
        assert key in trainer.callback_metrics and key in trainer.progress_bar_metrics
    assert trainer.callback_metrics["swarm/epoch"] > 0 and trainer.callback_metrics["swarm/local_samples"] > 0
    assert "train_loss" in trainer.callback_metrics
    line = next(r.getMessage() for r in caplog.records if "INITIAL_PEERS=" in r.getMessage())
    assert "INITIAL_PEERS=/ip4/127.0.0.1/tcp/" in line  # loopback: the only address it listens on
    with pytest.raises(SwarmNotStartedError):
        strategy.dht  # noqa: B018  (its own DHT is shut down with the fit)


def test_swarm_handles_are_live_during_fit(tmp_path: Any) -> None:
    seen: dict[str, Any] = {}

    class Probe(DigitsModule):
        def on_train_batch_end(self, *args: Any) -> None:
            strategy = self.trainer.strategy
            seen["maddrs"] = strategy.visible_maddrs()  # type: ignore[attr-defined]
            seen["dht_alive"] = strategy.dht.is_alive()  # type: ignore[attr-defined]
            seen["progress"] = strategy.swarm_progress()  # type: ignore[attr-defined]

    make_trainer(make_strategy(identity_path=str(tmp_path / "peer.key")), max_steps=3).fit(Probe(), digits())
    assert seen["dht_alive"] and seen["maddrs"][0].startswith("/ip4/127.0.0.1/tcp/")
    assert (tmp_path / "peer.key").exists()  # persistent identity written on first use
    assert seen["progress"].target_batch_size == 64


def test_a_dht_passed_in_is_used_and_left_running() -> None:
    dht = start_dht(initial_peers=[], host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    try:
        strategy = make_strategy(dht=dht, host_maddrs=None)
        make_trainer(strategy, max_steps=4).fit(DigitsModule(), digits())
        assert strategy.dht is dht and dht.is_alive()
    finally:
        dht.shutdown()


def test_batch_size_that_cannot_be_inferred_is_an_error_naming_the_fix() -> None:
    trainer = make_trainer(make_strategy())
    with pytest.raises(HivemindStrategyError, match=r"batch_size="):
        trainer.fit(DigitsModule(), train_dataloaders=fixed_loader(batch_size=None))
    assert trainer.global_step == 0


def test_explicit_batch_size_counts_progress_when_the_loader_declares_none() -> None:
    class Prebatched(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.rand(16, 64), torch.randint(0, 10, (16,))

    strategy = make_strategy(target_batch_size=16, batch_size=16)
    loader = torch.utils.data.DataLoader(Prebatched(), batch_size=None)
    make_trainer(strategy, max_steps=8).fit(DigitsModule(), train_dataloaders=loader)
    assert strategy.local_samples == 8 * 16 and strategy.optimizer.local_epoch == 8


def test_last_short_batch_counts_its_real_size() -> None:
    strategy = make_strategy(target_batch_size=1000)
    make_trainer(strategy, max_steps=-1, max_epochs=1).fit(DigitsModule(), fixed_loader(32, num_samples=80))
    assert strategy.local_samples == 80  # 32 + 32 + 16


class ZeroGradCounter(DigitsModule):
    calls = 0

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        type(self).calls += 1
        optimizer.zero_grad()


def test_reused_grad_buffers_skip_a_custom_zero_grad_with_a_warning_and_restore_it() -> None:
    module = ZeroGradCounter()
    strategy = make_strategy(reuse_grad_buffers=True)
    with pytest.warns(UserWarning, match="optimizer_zero_grad will not be called"):
        make_trainer(strategy, max_steps=6).fit(module, digits())
    assert ZeroGradCounter.calls == 0  # hivemind would have raised had it run
    assert strategy.optimizer.local_epoch >= 6 * 32 // 64
    assert "optimizer_zero_grad" not in module.__dict__
    assert module.optimizer_zero_grad.__func__ is ZeroGradCounter.optimizer_zero_grad  # type: ignore[attr-defined]


def test_reused_grad_buffers_with_the_default_zero_grad_warn_nothing() -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*optimizer_zero_grad.*")
        make_trainer(make_strategy(reuse_grad_buffers=True), max_steps=4).fit(DigitsModule(), digits())


def test_extra_keywords_reach_hivemind_optimizer() -> None:
    from functools import partial

    from hivemind.compression import Float16Compression
    from hivemind.optim.power_sgd_averager import PowerSGDGradientAverager

    strategy = make_strategy(
        target_batch_size=32,
        grad_compression=Float16Compression(),
        grad_averager_factory=partial(PowerSGDGradientAverager, averager_rank=4),
    )
    make_trainer(strategy, max_steps=4).fit(DigitsModule(), digits())
    assert isinstance(strategy.optimizer.grad_averager, PowerSGDGradientAverager)
    assert strategy.optimizer.local_epoch == 4
