"""Mixed precision with HivemindStrategy on CPU: bf16 without a scaler, fp16 with hivemind's GradScaler.

Lightning maps ``precision="16-mixed"`` on CPU to bf16, so the fp16 tests hand Lightning its AMP plugin
explicitly (``MixedPrecision("16-mixed", "cpu")``); torch runs fp16 autocast on CPU. The strategy
then swaps in hivemind's scaler, exactly as it does on a GPU.
"""

from __future__ import annotations

from typing import Any

import hivemind
import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision

from tests.support.strategy import SGDDigits, digits, fixed_loader, flat_params, make_strategy, make_trainer
from worker.examples.digits import DigitsModule
from worker.strategy.precision import HivemindMixedPrecision

pytestmark = pytest.mark.timeout(120)  # a lone peer: it runs in the other lane (tests/support/lanes.py)

INIT_SCALE = 2.0**16


def _train(precision: str, reuse_grad_buffers: bool = False, module: SGDDigits | None = None) -> Any:
    torch.manual_seed(7)
    module = module or SGDDigits(lr=0.5)
    # one swarm epoch per batch: epoch boundaries, and so results, are the same in every run
    strategy = make_strategy(target_batch_size=32, reuse_grad_buffers=reuse_grad_buffers)
    precision_args: dict[str, Any] = (
        {"plugins": [MixedPrecision("16-mixed", "cpu")]}
        if precision == "16-mixed"
        else {"precision": precision}
    )
    trainer = make_trainer(strategy, max_steps=6, **precision_args)
    trainer.fit(module, fixed_loader(batch_size=32))
    return trainer, strategy, module


def test_bf16_mixed_trains_without_a_scaler() -> None:
    trainer, strategy, module = _train("bf16-mixed")
    assert isinstance(trainer.precision_plugin, MixedPrecision) and trainer.precision_plugin.scaler is None
    assert strategy.optimizer.local_epoch == 6
    assert torch.isfinite(flat_params(module)).all()


@pytest.mark.parametrize("reuse_grad_buffers", [False, True], ids=["own-buffers", "reused-buffers"])
def test_fp16_uses_hivemind_scaler_and_applies_unscaled_gradients(reuse_grad_buffers: bool) -> None:
    _, _, reference = _train("32-true")
    trainer, strategy, module = _train("16-mixed", reuse_grad_buffers)
    plugin = trainer.precision_plugin
    assert isinstance(plugin, HivemindMixedPrecision) and isinstance(plugin.scaler, hivemind.GradScaler)
    assert strategy.optimizer.local_epoch == 6
    # same data, same start, plain SGD: fp16 autocast moves the result by ~1e-4, while gradients
    # left scaled by 65536 (or unscaled twice) would be off by orders of magnitude
    difference = float((flat_params(module) - flat_params(reference)).abs().max())
    change = float((flat_params(reference) - flat_params(_initial())).abs().max())
    assert difference < 0.02 * change, (difference, change)
    assert plugin.scaler.get_scale() == INIT_SCALE  # no overflow; growth only after 2000 clean swarm steps


def _initial() -> torch.nn.Module:
    torch.manual_seed(7)
    return SGDDigits(lr=0.5)


class OverflowOnce(SGDDigits):
    """Its loss overflows fp16 on the second batch only."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        return loss * 1e6 if batch_idx == 1 else loss  # x 65536 scale overflows fp16 gradients


@pytest.mark.parametrize("reuse_grad_buffers", [False, True], ids=["own-buffers", "reused-buffers"])
def test_fp16_overflow_drops_the_batch_and_halves_the_scale(reuse_grad_buffers: bool) -> None:
    trainer, strategy, module = _train("16-mixed", reuse_grad_buffers, module=OverflowOnce(lr=0.5))
    assert trainer.precision_plugin.scaler.get_scale() == INIT_SCALE / 2  # type: ignore[attr-defined]
    assert strategy.local_samples == 6 * 32 - 32  # the overflowing batch was not contributed
    assert torch.isfinite(flat_params(module)).all()


def test_default_lightning_fp16_on_cpu_falls_back_to_bf16_without_scaler() -> None:
    trainer = make_trainer(make_strategy(), max_steps=2, precision="16-mixed")
    trainer.fit(DigitsModule(), digits())
    assert trainer.precision_plugin.precision == "bf16-mixed"  # type: ignore[attr-defined]
