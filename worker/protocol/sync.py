"""How a run's workers train together (``strategy_options`` ``sync``) and the DiLoCo knobs: the modes,
their defaults, and the check that refuses options that do not go together.

Pure Python (no torch): the orchestrator writes :data:`NEW_RUN_SYNC` into a new run and the create-time
check of a run's ``strategy_options`` asks :func:`sync_problem`; ``HivemindStrategy`` reads the same
(``worker/strategy/diloco/settings.py`` builds its settings from them).
"""

from __future__ import annotations

import math
from typing import Any

#: ``sync`` values: ``gradients`` averages gradients every ``target_batch_size`` samples (hivemind's own
#: mode), ``local`` is hivemind's local SGD (``use_local_updates``: parameters averaged every swarm
#: epoch), ``diloco`` averages pseudo-gradients every ``sync_every_s`` and takes an outer step.
SYNC_MODES = ("gradients", "local", "diloco")
#: ``HivemindStrategy(sync=...)`` left out: lightning-hivemind's behaviour, so the strategy stays a drop-in
#: for it (and runs stored without a mode keep theirs).
DEFAULT_SYNC = "gradients"
#: The mode the orchestrator writes into a new run whose spec names none (``orchestrator/domain/sync.py``):
#: DiLoCo, the one mode in which more workers reached a target sooner than one (docs/benchmarks/scaling.md).
NEW_RUN_SYNC = "diloco"
#: Seconds of compute between DiLoCo rounds. A round's blocking part on one machine (the all-reduce of a
#: small model and the wait for the slowest peer; matchmaking is scheduled ahead and overlaps compute) is
#: of the order of a second or two, so 30 s keeps compute at least ten times the round's cost (G >= 10),
#: where the speed-up of more workers approaches its bound. Raise it for large models or slow links.
DEFAULT_SYNC_EVERY_S = 30.0
#: The outer optimizer of the DiLoCo paper (Douillard et al. 2023): Nesterov SGD, lr 0.7, momentum 0.9.
DEFAULT_OUTER_LR = 0.7
DEFAULT_OUTER_MOMENTUM = 0.9
#: the options that only the DiLoCo mode reads
DILOCO_OPTIONS = ("sync_every_s", "sync_every_steps", "outer_lr", "outer_momentum")
#: options of the gradients mode's hivemind optimizer that have nothing to act on in DiLoCo mode (the
#: module's own optimizer steps every batch, outside hivemind)
NOT_WITH_DILOCO = (
    "delay_state_averaging",
    "delay_optimizer_step",
    "delay_grad_averaging",
    "offload_optimizer",
    "reuse_grad_buffers",
    "scheduler_fn",
    "use_local_updates",
)


def sync_problem(sync: Any, options: dict[str, Any]) -> str | None:
    """None when ``sync`` and ``options`` (the strategy's; None or absent for those left out) can run;
    else what is wrong and the fix."""
    if sync not in SYNC_MODES:
        return f"sync must be one of {', '.join(map(repr, SYNC_MODES))}, got {sync!r}"
    if sync == "diloco":
        conflicting = sorted(key for key in NOT_WITH_DILOCO if options.get(key))
        if conflicting:
            return (
                f"{conflicting[0]} does not apply with sync='diloco': the module's own optimizer steps every "
                f"batch, outside hivemind's optimizer; remove it"
            )
    given = sorted(key for key in DILOCO_OPTIONS if options.get(key) is not None)
    if sync != "diloco" and given:
        return f"{given[0]} applies only with sync='diloco' (got sync={sync!r}): remove it or set sync"
    every_s, steps = options.get("sync_every_s"), options.get("sync_every_steps")
    if every_s is not None and not _positive_number(every_s):
        return f"sync_every_s must be a positive number of seconds, got {every_s!r}"
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0):
        return f"sync_every_steps must be a positive int, got {steps!r}"
    if every_s is not None and steps is not None:
        return "give sync_every_s (rounds by time) or sync_every_steps (rounds by steps), not both"
    lr, momentum = options.get("outer_lr"), options.get("outer_momentum")
    if lr is not None and not _positive_number(lr):
        return f"outer_lr must be a positive number, got {lr!r}"
    if momentum is not None and not (_number(momentum) and 0 <= momentum < 1):
        return f"outer_momentum must be a number in [0, 1), got {momentum!r}"
    return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive_number(value: Any) -> bool:
    return _number(value) and value > 0
