"""HivemindStrategy's options, peers and the errors it raises before any swarm process starts."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import hivemind
import pytest
import torch
from hivemind.utils import ValueWithExpiration
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from tests.support.strategy import digits, make_strategy, make_trainer
from worker.examples.digits import DigitsModule
from worker.strategy import HivemindStrategy, HivemindStrategyError, SwarmNotStartedError, SwarmProgress
from worker.strategy.dht import initial_peers_line, parse_initial_peers, shareable_maddrs
from worker.strategy.metrics import total_samples_per_second

pytestmark = pytest.mark.timeout(60)

PEER_ID = "12D3KooWA3SXhCZCEAKAR6m2HHy7ooSjs5ud1UqEMCTeyhpZFcyp"


def test_constructor_takes_every_lightning_hivemind_keyword_with_its_default() -> None:
    expected = dict(
        run_id="lightning_run",
        batch_size=None,
        delay_state_averaging=False,
        delay_optimizer_step=None,
        delay_grad_averaging=False,
        offload_optimizer=None,
        reuse_grad_buffers=False,
        scheduler_fn=None,
        matchmaking_time=5.0,
        averaging_timeout=30.0,
        verbose=False,
        averager_opts=None,
        host_maddrs=None,
        initial_peers=None,
    )
    parameters = inspect.signature(HivemindStrategy).parameters
    assert list(parameters)[: len(expected) + 1] == ["target_batch_size", *expected]  # same order too
    assert {name: parameters[name].default for name in expected} == expected
    assert parameters["target_batch_size"].default is inspect.Parameter.empty
    assert inspect.Parameter.VAR_KEYWORD in {p.kind for p in parameters.values()}  # **optimizer_kwargs


def test_constructor_starts_nothing_and_swarm_handles_wait_for_setup() -> None:
    strategy = HivemindStrategy(
        target_batch_size=64, grad_compression=hivemind.compression.Float16Compression()
    )
    with pytest.raises(SwarmNotStartedError):
        strategy.dht  # noqa: B018
    with pytest.raises(SwarmNotStartedError):
        strategy.optimizer  # noqa: B018
    with pytest.raises(SwarmNotStartedError):
        strategy.swarm_progress()
    assert strategy.local_samples == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(target_batch_size=0),
        dict(target_batch_size=64, batch_size=-1),
        dict(target_batch_size=64, delay_grad_averaging=True, delay_optimizer_step=False),
        dict(target_batch_size=64, delay_optimizer_step=True),  # without delay_state_averaging
        dict(target_batch_size=64, delay_grad_averaging=True),  # which delays the optimizer step too
    ],
)
def test_impossible_settings_fail_at_construction(kwargs: dict[str, Any]) -> None:
    with pytest.raises(HivemindStrategyError):
        HivemindStrategy(**kwargs)


def test_initial_peers_come_from_the_argument_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    addr = f"/ip4/10.0.0.1/tcp/31337/p2p/{PEER_ID}"
    other = f"/ip4/10.0.0.2/tcp/31337/p2p/{PEER_ID}"
    assert parse_initial_peers(f" {addr} ,, {other} ", environ={}) == [addr, other]
    assert parse_initial_peers([addr, " "], environ={}) == [addr]
    assert parse_initial_peers(None, environ={"INITIAL_PEERS": addr}) == [addr]
    assert parse_initial_peers(None, environ={"PL_INITIAL_PEERS": other}) == [other]
    assert parse_initial_peers(None, environ={"INITIAL_PEERS": addr, "PL_INITIAL_PEERS": other}) == [addr]
    assert parse_initial_peers(None, environ={"INITIAL_PEERS": " ", "PL_INITIAL_PEERS": other}) == [other]
    assert parse_initial_peers(None, environ={}) == []
    assert parse_initial_peers([], environ={"INITIAL_PEERS": addr}) == []  # explicit empty wins: new swarm
    with pytest.raises(TypeError):
        parse_initial_peers(42, environ={})  # type: ignore[arg-type]

    monkeypatch.setenv("INITIAL_PEERS", f"{addr},{other}")
    assert HivemindStrategy(target_batch_size=8).initial_peers == [addr, other]
    monkeypatch.delenv("INITIAL_PEERS")
    monkeypatch.setenv("PL_INITIAL_PEERS", other)
    assert HivemindStrategy(target_batch_size=8).initial_peers == [other]


def test_initial_peers_line_prefers_outside_addresses_but_keeps_loopback_if_alone() -> None:
    loopback = f"/ip4/127.0.0.1/tcp/4001/p2p/{PEER_ID}"
    lan = f"/ip4/192.0.2.2/tcp/4001/p2p/{PEER_ID}"
    assert shareable_maddrs([loopback, lan]) == [lan]
    assert initial_peers_line([loopback]) == f"INITIAL_PEERS={loopback}"
    assert initial_peers_line([loopback, lan, f"/ip6/::1/tcp/4001/p2p/{PEER_ID}"]) == f"INITIAL_PEERS={lan}"


def test_swarm_progress_is_a_frozen_record() -> None:
    progress = SwarmProgress(
        epoch=3, num_peers=2, samples_accumulated=10, target_batch_size=64, samples_per_second=9.5
    )
    assert [f.name for f in dataclasses.fields(progress)] == [
        "epoch", "num_peers", "samples_accumulated", "target_batch_size", "samples_per_second",
    ]  # fmt: skip
    with pytest.raises(dataclasses.FrozenInstanceError):
        progress.epoch = 4  # type: ignore[misc]


def test_swarm_rate_sums_what_live_peers_publish() -> None:
    def entry(rate: float | None) -> ValueWithExpiration:
        value = None if rate is None else {"epoch": 1, "samples_per_second": rate, "samples_accumulated": 3}
        return ValueWithExpiration(value, 1e12)

    record = ValueWithExpiration({b"a": entry(100.0), b"b": entry(50.5), b"gone": entry(None)}, 1e12)
    assert total_samples_per_second(record) == pytest.approx(150.5)
    assert total_samples_per_second(None) == 0.0


class TwoOptimizers(DigitsModule):
    def configure_optimizers(self) -> Any:
        return [
            torch.optim.SGD(self.net[0].parameters(), lr=0.1),
            torch.optim.SGD(self.net[2].parameters(), lr=0.1),
        ]

    def training_step(self, batch: Any, batch_idx: int) -> None:
        for optimizer in self.optimizers():  # type: ignore[union-attr]
            optimizer.zero_grad()
            self.manual_backward(super().training_step(batch, batch_idx))
            optimizer.step()


class PlateauDigits(DigitsModule):
    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(self.parameters())
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "train_loss"}}


def _manual(module: DigitsModule) -> DigitsModule:
    module.automatic_optimization = False
    return module


@pytest.mark.parametrize(
    ("module", "trainer_kwargs", "strategy_kwargs", "message"),
    [
        (_manual(TwoOptimizers()), {}, {}, "exactly one optimizer"),
        (PlateauDigits(), {}, {}, "ReduceLROnPlateau"),
        (DigitsModule(), {"accumulate_grad_batches": 2}, {}, "accumulate_grad_batches"),
        (DigitsModule(), {"gradient_clip_val": 1.0}, {"reuse_grad_buffers": True}, "gradient_clip_val"),
    ],
    ids=["two-optimizers", "plateau-scheduler", "grad-accumulation", "clipping-reused-buffers"],
)
def test_unsupported_setups_fail_before_training_with_the_fix_in_the_message(
    module: DigitsModule, trainer_kwargs: dict[str, Any], strategy_kwargs: dict[str, Any], message: str
) -> None:
    strategy = make_strategy(**strategy_kwargs)
    trainer = make_trainer(strategy, **trainer_kwargs)
    with pytest.raises(HivemindStrategyError, match=message) as error:
        trainer.fit(module, digits())
    assert isinstance(error.value, MisconfigurationException)  # what lightning-hivemind users catch
    assert trainer.global_step == 0
    with pytest.raises(SwarmNotStartedError):
        strategy.dht  # noqa: B018  (checked before the DHT was started)


def test_more_than_one_device_per_peer_is_refused() -> None:
    trainer = make_trainer(make_strategy(), devices=2)
    with pytest.raises(HivemindStrategyError, match="one device per peer"):
        trainer.fit(DigitsModule(), digits())
