"""Where ``HivemindStrategy``'s extra keywords go: ``hivemind.DHT`` or ``hivemind.Optimizer``.

The strategy takes the keywords of both, as lightning-hivemind's users expect (``use_relay`` and
``use_auto_relay`` for a peer behind NAT configure its DHT; ``grad_compression`` its optimizer). Both
families are read from hivemind's own signatures, never listed by hand, so an upgrade of hivemind cannot
leave them out of step: the DHT's are those of ``hivemind.DHT``, of ``DHTNode.create`` (which it passes
its extra keywords to) and of ``P2P.create`` (which the node passes them on to). A keyword both accept
(``shutdown_timeout``) goes to the optimizer. A keyword neither accepts is refused with the closest
match from either family.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from worker.strategy.checks import HivemindStrategyError

#: DHT keywords the strategy (or the agent) sets itself: a run cannot hand them in as extras.
DHT_SET_BY_STRATEGY = frozenset(
    {"start", "p2p", "await_ready", "daemon", "record_validator", "record_validators", "initial_peers"}
)
#: ``hivemind.Optimizer`` keywords the strategy fills itself when it builds the optimizer.
OPTIMIZER_SET_BY_STRATEGY = frozenset(
    {"dht", "run_id", "target_batch_size", "optimizer", "params", "scheduler", "batch_size_per_step"}
)


def signature_keywords(function: Callable[..., Any]) -> set[str]:
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name for p in inspect.signature(function).parameters.values() if p.kind in kinds} - {
        "self",
        "cls",
    }


@cache
def optimizer_keywords() -> frozenset[str]:
    """``hivemind.Optimizer``'s keywords a user may pass through the strategy."""
    import hivemind

    return frozenset(signature_keywords(hivemind.Optimizer.__init__) - OPTIMIZER_SET_BY_STRATEGY)


@cache
def dht_keywords() -> frozenset[str]:
    """Keywords that configure the peer's ``hivemind.DHT`` (its node and its libp2p daemon)."""
    import hivemind
    from hivemind.dht.node import DHTNode
    from hivemind.p2p import P2P

    found = set().union(*(signature_keywords(f) for f in (hivemind.DHT.__init__, DHTNode.create, P2P.create)))
    return frozenset(found - DHT_SET_BY_STRATEGY - optimizer_keywords())


@dataclass(frozen=True)
class RoutedKeywords:
    dht: dict[str, Any]
    optimizer: dict[str, Any]


def route_keywords(extra: Mapping[str, Any]) -> RoutedKeywords:
    """Split the strategy's extra keywords by the hivemind class that takes them.

    Raises ``HivemindStrategyError`` for a keyword neither takes, naming the closest known one.
    """
    dht, optimizer = {}, {}
    for key, value in extra.items():
        if key in optimizer_keywords():
            optimizer[key] = value
        elif key in dht_keywords():
            dht[key] = value
        else:
            raise HivemindStrategyError(unknown_keyword_message(key))
    return RoutedKeywords(dht=dht, optimizer=optimizer)


def unknown_keyword_message(key: str) -> str:
    """Why ``key`` is refused, with the closest keyword of either family."""
    known = sorted(optimizer_keywords() | dht_keywords())
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (
        f"HivemindStrategy got an unknown keyword {key!r}{hint}: extra keywords go to hivemind.Optimizer "
        f"or to hivemind.DHT, and neither takes it"
    )


#: hivemind's own ``request_timeout`` default for its averagers, in seconds
HIVEMIND_REQUEST_TIMEOUT_S = 3.0


def averager_options(averager_opts: dict[str, Any] | None, matchmaking_time: float) -> dict[str, Any]:
    """The averagers' options: ``request_timeout`` below ``matchmaking_time`` unless given.

    hivemind warns in every peer's log when a follower may wait on a leader longer than the matchmaking
    window (``request_timeout >= min_matchmaking_time``, its default 3 s against the 1-5 s windows used):
    such a wait can outlast the round and leave the follower without a group.
    """
    return {"request_timeout": min(HIVEMIND_REQUEST_TIMEOUT_S, matchmaking_time / 2), **(averager_opts or {})}
