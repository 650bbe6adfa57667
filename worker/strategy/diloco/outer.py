"""The outer side of DiLoCo in plain torch: the global weights kept on the CPU and the outer step.

The global weights are what every peer of a round agreed on after the last outer step. Between rounds
the inner optimizer moves the local weights; the pseudo-gradient is global minus local (the direction
the inner steps went, negated, so that a gradient-descent step along it moves the global weights the
way the peers trained). After a round the outer optimizer (Nesterov SGD) steps the global weights with
the group's weighted mean pseudo-gradient and the local weights are overwritten by the result. A round
that failed leaves the global weights as they were and puts them back into the local weights.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

MOMENTUM_KEY = "momentum_buffer"


def weighted_mean(tensors_by_peer: Sequence[Sequence[Tensor]], weights: Sequence[float]) -> list[Tensor]:
    """Per tensor, the mean over peers weighted by ``weights`` (what hivemind's weighted all-reduce
    computes): the reference the tests hold the real averaging to."""
    total = float(sum(weights))
    return [
        sum((w / total) * tensors[i] for tensors, w in zip(tensors_by_peer, weights, strict=True))  # type: ignore[misc]
        for i in range(len(tensors_by_peer[0]))
    ]


class OuterStep:
    """The global weights on the CPU and their outer optimizer.

    ``lock`` guards both: a peer's averager thread reads them (:meth:`state_tensors`) to hand them to a
    joiner while the training thread may be applying a round.
    """

    def __init__(self, params: Sequence[Tensor], lr: float, momentum: float) -> None:
        self.lock = threading.Lock()
        self.global_params = [p.detach().to("cpu", copy=True).requires_grad_(True) for p in params]
        self.optimizer = torch.optim.SGD(self.global_params, lr=lr, momentum=momentum, nesterov=momentum > 0)

    def pseudo_gradients(self, params: Sequence[Tensor]) -> list[Tensor]:
        """Global minus local weights, on the CPU, in the global weights' dtype."""
        with self.lock:
            return [
                g.detach() - p.detach().to("cpu", g.dtype)
                for g, p in zip(self.global_params, params, strict=True)
            ]

    def apply(self, mean_pseudo_gradients: Sequence[Tensor]) -> None:
        """One outer step of the global weights with the round's mean pseudo-gradient."""
        with self.lock:
            for g, grad in zip(self.global_params, mean_pseudo_gradients, strict=True):
                g.grad = grad.to(g.dtype).clone()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    @torch.no_grad()
    def copy_into(self, params: Sequence[Tensor]) -> None:
        """The local weights become the global ones (after a round, or to discard a failed one)."""
        with self.lock:
            for g, p in zip(self.global_params, params, strict=True):
                p.copy_(g.detach())

    def momentum_buffers(self) -> list[Tensor]:
        """The outer optimizer's momentum per parameter (zeros before its first step)."""
        state = self.optimizer.state
        return [
            state[g][MOMENTUM_KEY].detach()
            if MOMENTUM_KEY in state.get(g, {})
            else torch.zeros_like(g.detach())
            for g in self.global_params
        ]

    def state_tensors(self) -> tuple[bool, list[Tensor]]:
        """(whether the outer optimizer has stepped, global weights then momentum buffers), copied."""
        with self.lock:
            stepped = any(MOMENTUM_KEY in self.optimizer.state.get(g, {}) for g in self.global_params)
            tensors = [g.detach().clone() for g in self.global_params]
            return stepped, tensors + [m.clone() for m in self.momentum_buffers()]

    @torch.no_grad()
    def load_state_tensors(self, stepped: bool, tensors: Sequence[Tensor]) -> None:
        """Take a peer's :meth:`state_tensors` (or a checkpoint's)."""
        count = len(self.global_params)
        if len(tensors) != 2 * count:
            raise ValueError(f"expected {2 * count} outer state tensors, got {len(tensors)}")
        with self.lock:
            for g, saved in zip(self.global_params, tensors[:count], strict=True):
                g.copy_(saved.to(g.dtype))
            self.optimizer.state.clear()
            if stepped:
                for g, saved in zip(self.global_params, tensors[count:], strict=True):
                    self.optimizer.state[g] = {MOMENTUM_KEY: saved.to(g.dtype).clone()}

    def state_dict(self) -> dict[str, Any]:
        """For a checkpoint: plain containers and tensors (loads with ``weights_only=True``)."""
        stepped, tensors = self.state_tensors()
        return {"stepped": stepped, "tensors": tensors}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.load_state_tensors(bool(saved["stepped"]), list(saved["tensors"]))
