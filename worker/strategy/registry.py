"""``Trainer(strategy="hivemind")``: the strategy registered by name with Lightning.

Lightning builds a strategy given by name from its ``StrategyRegistry`` (``lightning.pytorch.strategies``):
each entry is a callable and the keywords it is called with, nothing from the ``Trainer``. Importing
``worker.strategy`` registers :data:`LIGHTNING_NAME` there (:func:`register_with_lightning`): at once when
Lightning's strategies are loaded already, else the moment Lightning loads them, by a one-time import hook
on that one module that removes itself when used. Importing the package thus never loads Lightning on its
own: the orchestrator imports ``worker.strategy.dht`` (through swarm admission's authorizer) and has no
use for Lightning, which takes seconds to import.

A strategy built from the name gets :data:`DEFAULT_TARGET_BATCH_SIZE` for the one keyword without a
default, and the constructor's defaults for the rest: ``run_id="lightning_run"``, initial peers from
``INITIAL_PEERS`` (or ``PL_INITIAL_PEERS``) when it is built, none starting a new swarm, every IPv4
interface on a free port, ``sync="gradients"`` (docs/guides/strategy.md says the same). Anything else
takes ``HivemindStrategy(...)`` itself.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from worker.strategy.strategy import HivemindStrategy

#: the name ``Trainer(strategy=...)`` takes once ``worker.strategy`` is imported
LIGHTNING_NAME = "hivemind"
#: ``target_batch_size`` of a strategy built from the name: the value of lightning-hivemind's example
DEFAULT_TARGET_BATCH_SIZE = 8192
#: the module that holds Lightning's ``StrategyRegistry``
STRATEGIES_MODULE = "lightning.pytorch.strategies"
DESCRIPTION = "training over hivemind with peers that come and go (worker.strategy.HivemindStrategy)"


def strategy_from_name(**init_params: Any) -> HivemindStrategy:
    """What the registry calls for ``"hivemind"``: the strategy (torch, Lightning and hivemind load here)."""
    from worker.strategy.strategy import HivemindStrategy

    return HivemindStrategy(**init_params)


def register(registry: Any) -> None:
    """Put :data:`LIGHTNING_NAME` into ``registry`` (Lightning's ``_StrategyRegistry``; idempotent)."""
    registry.register(
        LIGHTNING_NAME,
        strategy_from_name,
        description=DESCRIPTION,
        override=True,
        target_batch_size=DEFAULT_TARGET_BATCH_SIZE,
    )


def register_with_lightning() -> None:
    """Register :data:`LIGHTNING_NAME` now if Lightning's strategies are loaded, else when they load."""
    module = sys.modules.get(STRATEGIES_MODULE)
    if module is not None:
        register(module.StrategyRegistry)
    elif not any(isinstance(finder, _RegisterOnLoad) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnLoad())


class _RegisterOnLoad(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for :data:`STRATEGIES_MODULE` it asks the other finders and wraps the loader
    they give, which registers once the module has run and then takes this finder off ``sys.meta_path``."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != STRATEGIES_MODULE:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None and finder is not self else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _RegisteringLoader(spec.loader, self)
                return spec
        return None


class _RegisteringLoader(importlib.abc.Loader):
    """Lightning's own loader of :data:`STRATEGIES_MODULE`, registering once the module has run."""

    def __init__(self, loader: importlib.abc.Loader, finder: _RegisterOnLoad) -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        register(module.StrategyRegistry)
        if self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename... for tracebacks and inspect
        return getattr(self._loader, name)
