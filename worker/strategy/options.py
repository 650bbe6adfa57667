"""Which keys a run's ``strategy_options`` may hold: the one place that knows ``HivemindStrategy``'s keywords
(a run's Trainer options are :mod:`worker.protocol.trainer`).

They are read from the signatures, never listed by hand: ``HivemindStrategy``'s own keywords, plus
those of ``hivemind.Optimizer`` and ``hivemind.DHT`` that it routes on (:mod:`worker.strategy.keywords`),
less what the run spec or the agent sets itself. The create-time probe (``worker/agent/probe.py``)
and the agent both ask :func:`strategy_option_problem`, so a Trainer option such as ``precision`` put
there, a value of the wrong type for one of the strategy's own keywords (:mod:`worker.arguments`), or
delay flags that do not go together, are refused when the run is created, not inside
``hivemind.Optimizer`` on every worker. Imports
torch, Lightning and hivemind when first called.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from worker.protocol.runs import SWARM_ADMISSION_OPTION
from worker.protocol.sync import DEFAULT_SYNC, sync_problem
from worker.protocol.trainer import trainer_option_in_strategy_options

#: ``HivemindStrategy`` keywords the agent fills from the run spec or its own state.
SET_BY_AGENT = {
    "target_batch_size": "it is the run spec's target_batch_size",
    "batch_size": "it is the run spec's batch_size",
    "run_id": "it is the run's swarm id",
    "dht": "the agent starts the worker's DHT",
    "authorizer": "the agent holds the worker's swarm token",
}


@cache
def strategy_keywords() -> frozenset[str]:
    """Every key ``strategy_options`` may hold (``swarm_admission``, the agent's own, included)."""
    from worker.strategy.keywords import dht_keywords, optimizer_keywords, signature_keywords
    from worker.strategy.strategy import HivemindStrategy

    own = signature_keywords(HivemindStrategy.__init__)
    routed = optimizer_keywords() | dht_keywords()
    return frozenset((own | routed | {SWARM_ADMISSION_OPTION}) - set(SET_BY_AGENT))


def strategy_option_problem(options: Mapping[str, Any]) -> str | None:
    """None when every key of ``options`` is one the strategy takes; else what is wrong, and the fix."""
    trainer_option = trainer_option_in_strategy_options(dict(options))
    if trainer_option:
        return trainer_option
    for key in options:
        if key in SET_BY_AGENT:
            return f"{key} cannot be set in strategy_options: {SET_BY_AGENT[key]}"
    from worker.strategy.keywords import unknown_keyword_message

    unknown = sorted(set(options) - strategy_keywords())
    if unknown:
        return unknown_keyword_message(unknown[0])
    from worker.arguments import argument_type_problem
    from worker.strategy.strategy import HivemindStrategy

    mistyped = argument_type_problem(HivemindStrategy, options)  # its own keywords' plain annotations
    if mistyped:
        return f"{mistyped[0]}: {mistyped[1]}"
    return _combination_problem(options) or _sync_problem(options)


def _combination_problem(options: Mapping[str, Any]) -> str | None:
    """The strategy's own checks of its delay flags and timeouts (``worker/strategy/checks.py``, which
    ``HivemindStrategy.__init__`` calls too), on the options and the strategy's defaults for what is left
    out; values of another type are left to hivemind, which reports them itself."""
    import inspect

    from worker.strategy.checks import HivemindStrategyError, check_delays, check_timeouts
    from worker.strategy.strategy import HivemindStrategy

    defaults = inspect.signature(HivemindStrategy.__init__).parameters

    def value(name: str) -> Any:
        return options.get(name, defaults[name].default)

    delays = [value(n) for n in ("delay_state_averaging", "delay_optimizer_step", "delay_grad_averaging")]
    times = [value(name) for name in ("matchmaking_time", "averaging_timeout")]
    try:
        if all(isinstance(flag, bool) or flag is None for flag in delays):
            check_delays(*delays)
        if all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in times):
            check_timeouts(*times)
    except HivemindStrategyError as exc:
        return str(exc)
    return None


def _sync_problem(options: Mapping[str, Any]) -> str | None:
    """The sync mode and its DiLoCo knobs, checked as the strategy checks them (pure: no torch); a key
    without its value (None) passes."""

    sync = options.get("sync")
    return sync_problem(DEFAULT_SYNC if sync is None else sync, dict(options))
