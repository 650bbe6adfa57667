"""``HivemindStrategy`` for Lightning 2.x and its hivemind pieces; nothing here knows the orchestrator.

- ``strategy.py``: the strategy (setup starts the DHT and wraps the optimizer, teardown leaves the swarm).
- ``registry.py``: the name ``"hivemind"`` in Lightning's strategy registry, and what it builds.
- ``checks.py``: the errors and the checks of keywords and timeouts made at construction and setup.
- ``keywords.py``: which extra keyword goes to ``hivemind.DHT`` and which to ``hivemind.Optimizer``.
- ``options.py``: a run spec's ``strategy_options`` checked against the strategy's keywords (create time).
- ``dht.py``: initial peers, starting the DHT, the addresses to tell others.
- ``optimizer.py``: building the ``hivemind.Optimizer``, its schedulers and its state in checkpoints.
- ``schedulers.py``: learning-rate schedulers stepped once per swarm epoch.
- ``precision.py``: mixed precision with hivemind's gradient scaler.
- ``metrics.py``: swarm progress and throughput, logged as Lightning metrics.
- ``outcomes.py``: each swarm epoch's averaging outcome, counted.
- ``shutdown.py``: leaving the swarm cleanly.
- ``diloco/``: the DiLoCo sync mode (``sync="diloco"``): rare rounds of pseudo-gradients, an outer step.

``from worker.strategy import HivemindStrategy`` is the one public import path. Importing this package also
registers the strategy with Lightning as ``"hivemind"`` (``Trainer(strategy="hivemind")``; defaults in
``registry.py``). Importing it alone is cheap: the strategy (torch, Lightning, hivemind) loads on first use
of one of its names, and the registration waits for Lightning to load, so that ``worker.strategy.dht``
can be imported without Lightning. What a checkpoint holds besides Lightning's keys is
``worker/protocol/checkpoints.py``; hivemind's workarounds are ``worker/_hivemind_compat.py``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from worker.strategy.registry import register_with_lightning

if TYPE_CHECKING:
    from worker.strategy.checks import HivemindStrategyError, SwarmNotStartedError
    from worker.strategy.metrics import SwarmProgress
    from worker.strategy.strategy import HivemindStrategy

__all__ = ["HivemindStrategy", "HivemindStrategyError", "SwarmNotStartedError", "SwarmProgress"]

_HOMES = {
    "HivemindStrategy": "worker.strategy.strategy",
    "HivemindStrategyError": "worker.strategy.checks",
    "SwarmNotStartedError": "worker.strategy.checks",
    "SwarmProgress": "worker.strategy.metrics",
}


def __getattr__(name: str) -> Any:
    """The public names, imported from their modules on first use (PEP 562)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


register_with_lightning()
