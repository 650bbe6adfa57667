"""``Trainer(strategy="hivemind")`` builds HivemindStrategy with the guide's defaults; nothing starts."""

from __future__ import annotations

import pytest
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import StrategyRegistry

from worker.protocol.trainer import QUIET
from worker.strategy import HivemindStrategy, SwarmNotStartedError
from worker.strategy.registry import DEFAULT_TARGET_BATCH_SIZE, LIGHTNING_NAME

pytestmark = pytest.mark.timeout(60)

PEER = "/ip4/10.0.0.5/tcp/41237/p2p/12D3KooWA3SXhCZCEAKAR6m2HHy7ooSjs5ud1UqEMCTeyhpZFcyp"


def test_the_name_hivemind_builds_the_strategy_with_its_documented_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INITIAL_PEERS", PEER)
    assert LIGHTNING_NAME == "hivemind" and "hivemind" in StrategyRegistry.available_strategies()

    strategy = Trainer(strategy="hivemind", accelerator="cpu", devices=1, **QUIET).strategy

    assert isinstance(strategy, HivemindStrategy)
    assert strategy.target_batch_size == DEFAULT_TARGET_BATCH_SIZE == 8192
    assert strategy.run_id == "lightning_run" and strategy.sync == "gradients"
    assert strategy.initial_peers == [PEER]  # read from the environment when the Trainer builds it
    with pytest.raises(SwarmNotStartedError):  # constructing it started nothing
        strategy.dht  # noqa: B018


def test_the_name_without_initial_peers_in_the_environment_starts_a_new_swarm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("INITIAL_PEERS", raising=False)
    monkeypatch.delenv("PL_INITIAL_PEERS", raising=False)
    strategy = Trainer(strategy="hivemind", accelerator="cpu", devices=1, **QUIET).strategy
    assert isinstance(strategy, HivemindStrategy) and strategy.initial_peers == []
