"""The run's model in DiLoCo mode: the module's state with the global weights in place of the local ones.

Between rounds each peer's local weights drift on its own batches; what the peers agreed on is the global
copy the outer step keeps. A checkpoint (and so ``spotswarm runs export``) must hand users that model, not
one peer's local weights half a round along, so ``HivemindStrategy`` saves this state as the checkpoint's
``state_dict`` and keeps the local weights in the optimizer's state, for a resume
(``worker/strategy/diloco/optimizer.py``). Buffers (batch-norm statistics) are not averaged and stay the
peer's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor


def global_model_state(
    module: torch.nn.Module,
    state: dict[str, Any],
    params: Sequence[Tensor],
    global_weights: Sequence[Tensor],
) -> dict[str, Any]:
    """``state`` (the module's ``state_dict``) with each of ``params`` replaced by its global weights, on
    the entry's device and dtype; a tied parameter is replaced under each of its names."""
    names: dict[int, list[str]] = {}
    for name, named in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(named), []).append(name)
    out = dict(state)
    for param, weights in zip(params, global_weights, strict=True):
        for name in names.get(id(param), ()):
            if name in out:
                out[name] = weights.detach().to(out[name].device, out[name].dtype)
    return out
