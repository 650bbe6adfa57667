"""hivemind's ``DecentralizedAverager`` for DiLoCo rounds: pseudo-gradients in, the group's mean out.

Its averaged tensors are buffers of the global weights' shapes, filled with this peer's pseudo-gradient
just before the round's all-reduce is allowed to start, and sent compressed (fp16 by default: half the
bytes, and a pseudo-gradient is a small difference that fp16 holds well). Each peer's weight is the
number of samples it computed in the round, so the mean is the one a single worker would get from the
same samples; a joiner's first round weighs 0.

A joiner downloads the state this averager shares (:meth:`DiLoCoAverager.get_current_state`): the
global weights and the outer optimizer's momentum, exactly (no compression), and the round counter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from hivemind import DHT
from hivemind.averaging import DecentralizedAverager
from hivemind.compression import CompressionBase, Float16Compression, NoCompression

from worker.strategy.diloco.outer import OuterStep

EPOCH_KEY = "epoch"
STEPPED_KEY = "outer_stepped"


class DiLoCoAverager(DecentralizedAverager):
    """Averages pseudo-gradients; shares ``outer``'s state and the epoch ``epoch()`` returns."""

    def __init__(
        self,
        outer: OuterStep,
        epoch: Callable[[], int],
        dht: DHT,
        *,
        prefix: str,
        compression: CompressionBase | None = None,
        **kwargs: Any,
    ) -> None:
        self._outer = outer
        self._epoch = epoch
        buffers = [torch.zeros_like(g.detach()) for g in outer.global_params]
        super().__init__(
            buffers,
            dht,
            prefix=prefix,
            compression=compression if compression is not None else Float16Compression(),
            state_compression=NoCompression(),
            start=True,
            **kwargs,
        )

    def get_current_state(self) -> tuple[Any, Sequence[torch.Tensor], Any]:
        """What a joiner downloads (runs in this process's background thread, under ``outer.lock``)."""
        stepped, tensors = self._outer.state_tensors()
        return {EPOCH_KEY: self._epoch(), STEPPED_KEY: stepped}, tensors, None
