"""fp16 mixed precision for ``hivemind.Optimizer``: Lightning's AMP plugin driven the way hivemind expects.

hivemind accumulates gradients over many local batches before one global step, so the loss scale
must not change in between and gradients must be unscaled exactly once. ``hivemind.GradScaler`` does
the bookkeeping; ``hivemind.Optimizer.step(grad_scaler=...)`` resets the accumulated batch on
overflow and unscales at the global step. Lightning's stock plugin instead calls ``scaler.step(opt)``,
which never hands the scaler to the optimizer, so hivemind would accumulate scaled gradients.

Two cases, one per ``reuse_grad_buffers``:

* ``True``: gradients accumulate in ``param.grad`` across batches; hivemind unscales the sum at the
  global step (the mode ``hivemind.GradScaler`` was written for).
* ``False``: hivemind copies each batch's ``param.grad`` into its own accumulators, which it never
  unscales; so each batch's gradients are unscaled here, before hivemind checks and copies them.
  The global step's unscale then only touches the already-copied ``param.grad`` of the last batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import hivemind
import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.plugins.precision import MixedPrecision
from typing_extensions import override


def make_hivemind_scaler(device: str, template: torch.amp.GradScaler | None = None) -> hivemind.GradScaler:
    """A ``hivemind.GradScaler`` for ``device``, with the scale settings of ``template`` if given."""
    if isinstance(template, hivemind.GradScaler):
        return template
    if template is None:
        return hivemind.GradScaler(device=device)
    return hivemind.GradScaler(
        device=device,
        init_scale=template.get_scale(),
        growth_factor=template.get_growth_factor(),
        backoff_factor=template.get_backoff_factor(),
        growth_interval=template.get_growth_interval(),
        enabled=template.is_enabled(),
    )


class HivemindMixedPrecision(MixedPrecision):
    """``precision="16-mixed"`` for ``HivemindStrategy``: autocast to fp16 and a ``hivemind.GradScaler``."""

    def __init__(
        self, device: str, reuse_grad_buffers: bool, scaler: torch.amp.GradScaler | None = None
    ) -> None:
        super().__init__("16-mixed", device, scaler=make_hivemind_scaler(device, scaler))
        self.reuse_grad_buffers = reuse_grad_buffers

    @property
    def hivemind_scaler(self) -> hivemind.GradScaler:
        """The scaler (always a ``hivemind.GradScaler``)."""
        assert isinstance(self.scaler, hivemind.GradScaler)
        return self.scaler

    @override
    def optimizer_step(  # type: ignore[override]
        self,
        optimizer: Any,
        model: LightningModule,
        closure: Callable[[], Any],
        **kwargs: Any,
    ) -> Any:
        if not isinstance(optimizer, hivemind.Optimizer):
            return super().optimizer_step(optimizer, model=model, closure=closure, **kwargs)
        closure_result = closure()
        if closure_result is None and model.automatic_optimization:
            return closure_result  # backward was skipped: nothing to accumulate
        if not self.reuse_grad_buffers:
            self._unscale_batch_gradients(optimizer)
        self._after_closure(model, optimizer)  # hooks and clipping see unscaled gradients (when possible)
        optimizer.step(grad_scaler=self.hivemind_scaler, **kwargs)
        self.hivemind_scaler.update()
        return closure_result

    @torch.no_grad()
    def _unscale_batch_gradients(self, optimizer: hivemind.Optimizer) -> None:
        inverse_scale = 1.0 / self.hivemind_scaler.get_scale()
        grads = [
            param.grad
            for group in optimizer.param_groups
            for param in group["params"]
            if param.grad is not None
        ]
        if grads:
            torch._foreach_mul_(grads, inverse_scale)
