"""Drop-in parity with lightning-hivemind 0.1.0: code that reads its public attributes runs unchanged,
its ``scheduler_fn`` warning, and extra keywords routed to the hivemind class that takes them
(``hivemind.DHT`` or ``hivemind.Optimizer``), read from hivemind's signatures."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from hivemind.dht import DHT, DHTNode
from lightning.pytorch import Callback, Trainer

from tests.support.strategy import digits, make_strategy, make_trainer
from worker.agent.config import parse_config
from worker.agent.training import split_strategy_options
from worker.examples.digits import DigitsModule
from worker.strategy import HivemindStrategy, HivemindStrategyError
from worker.strategy.keywords import averager_options, dht_keywords, optimizer_keywords, route_keywords
from worker.strategy.options import strategy_option_problem

pytestmark = pytest.mark.timeout(90)


class LightningHivemindUser(Callback):
    """What a user of lightning-hivemind reads from its strategy while training (its public attributes)."""

    def __init__(self) -> None:
        self.num_peers: list[int] = []
        self.tracked: list[int] = []  # what hivemind's progress tracker said at the same moment
        self.maddrs: list[Any] = []
        self.devices: list[torch.device] = []

    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        strategy = trainer.strategy
        self.num_peers.append(strategy.num_peers)  # type: ignore[attr-defined]
        self.tracked.append(trainer.optimizers[0].tracker.global_progress.num_peers)
        self.maddrs = strategy.dht.get_visible_maddrs()  # type: ignore[attr-defined]
        self.devices.append(strategy.root_device)
        assert strategy.global_rank == 0 and strategy.is_global_zero


def test_code_written_for_lightning_hivemind_runs_unchanged() -> None:
    strategy = make_strategy()
    assert strategy.num_peers == 1  # before fit, as there
    assert strategy.INITIAL_PEERS_ENV == "PL_INITIAL_PEERS"
    user = LightningHivemindUser()
    make_trainer(strategy, callbacks=[user], max_steps=6).fit(DigitsModule(), datamodule=digits())
    # as there: the peers hivemind's progress tracker counts (a lone peer's own record may not be in yet)
    assert len(user.num_peers) == 6 and user.num_peers == user.tracked, (user.num_peers, user.tracked)
    assert user.maddrs and set(user.devices) == {torch.device("cpu")}
    assert strategy.num_peers == strategy.optimizer.tracker.global_progress.num_peers  # the last view


async def _p2pd_args_and_bucket_size(dht: DHT, node: DHTNode) -> tuple[list[str], int]:
    pid = node.p2p._child.pid
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return args, node.protocol.bucket_size


class DHTReader(Callback):
    """Reads, while training, what the peer's DHT node and its libp2p daemon were started with."""

    def __init__(self) -> None:
        self.seen: tuple[list[str], int] | None = None

    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        if self.seen is None:
            self.seen = trainer.strategy.dht.run_coroutine(_p2pd_args_and_bucket_size)  # type: ignore[attr-defined]


def test_dht_keywords_configure_the_peers_dht_and_libp2p_daemon() -> None:
    strategy = make_strategy(use_relay=False, force_reachability="public", bucket_size=7)
    reader = DHTReader()
    make_trainer(strategy, callbacks=[reader], max_steps=2).fit(DigitsModule(), datamodule=digits())
    assert reader.seen is not None
    args, bucket_size = reader.seen
    assert "-relay=0" in args and "-forceReachabilityPublic=1" in args, args
    assert bucket_size == 7


def test_optimizer_keywords_reach_the_optimizer_and_a_keyword_both_take_goes_there() -> None:
    strategy = make_strategy(load_state_timeout=7.0, shutdown_timeout=4.0)
    make_trainer(strategy, max_steps=2).fit(DigitsModule(), datamodule=digits())
    assert strategy.optimizer.load_state_timeout == 7.0
    assert strategy.optimizer.shutdown_timeout == 4.0
    routed = route_keywords({"use_auto_relay": True, "grad_compression": None, "shutdown_timeout": 1.0})
    assert routed.dht == {"use_auto_relay": True}
    assert routed.optimizer == {"grad_compression": None, "shutdown_timeout": 1.0}


def test_a_keyword_neither_takes_is_refused_with_the_closest_one_before_anything_starts() -> None:
    with pytest.raises(
        HivemindStrategyError, match=r"unknown keyword 'use_rellay'.*did you mean 'use_relay'"
    ):
        HivemindStrategy(target_batch_size=64, use_rellay=True)
    with pytest.raises(HivemindStrategyError, match="did you mean 'grad_compression'"):
        HivemindStrategy(target_batch_size=64, grad_compresion=None)
    problem = strategy_option_problem({"use_auto_rellay": True})
    assert problem is not None and "did you mean 'use_auto_relay'" in problem
    assert strategy_option_problem({"use_relay": False, "grad_compression": None}) is None


def test_the_keyword_families_come_from_hiveminds_signatures() -> None:
    assert {"use_relay", "use_auto_relay", "force_reachability", "bucket_size"} <= dht_keywords()
    assert {"grad_compression", "load_state_timeout", "average_state_every"} <= optimizer_keywords()
    # what the strategy sets itself is not a user's keyword
    assert not {"start", "p2p", "initial_peers", "record_validators"} & dht_keywords()
    assert not {"dht", "run_id", "params", "batch_size_per_step"} & optimizer_keywords()
    assert not dht_keywords() & optimizer_keywords()


@pytest.mark.parametrize(
    "flags",
    [
        {"delay_state_averaging": True},
        {"offload_optimizer": True},
        {"delay_optimizer_step": True, "delay_state_averaging": True},
    ],
    ids=["delay_state_averaging", "offload_optimizer", "delay_optimizer_step"],
)
def test_scheduler_fn_warning_whenever_hivemind_may_step_the_optimizer_away(flags: dict[str, bool]) -> None:
    with pytest.warns(UserWarning, match="scheduler_fn=lambda optimizer"):
        HivemindStrategy(target_batch_size=64, **flags)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        HivemindStrategy(target_batch_size=64, scheduler_fn=lambda opt: None, **flags)
        HivemindStrategy(target_batch_size=64)


def test_the_agent_starts_its_dht_with_the_runs_dht_keywords(tmp_path: Path) -> None:
    config = parse_config(["--url", "http://x", "--join-token", "t", "--worker-dir", str(tmp_path)])
    options = {"use_relay": False, "identity_path": "/k", "matchmaking_time": 1.0, "swarm_admission": True}
    split = split_strategy_options(options, config)
    assert split.dht == {"use_relay": False, "identity_path": "/k"}
    assert split.strategy == {"matchmaking_time": 1.0}


def test_a_worker_started_by_hand_averages_its_state_in_the_same_epochs_as_the_runs_workers(
    tmp_path: Path,
) -> None:
    # A peer that averages its state where the others do not waits out averaging_timeout alone (a
    # hand-started HivemindStrategy once did so in 9 epochs of 10 beside a run's workers): the agent
    # adds nothing of its own, so both get the strategy's default.
    config = parse_config(["--url", "http://x", "--join-token", "t", "--worker-dir", str(tmp_path)])
    by_agent = HivemindStrategy(target_batch_size=64, **split_strategy_options({}, config).strategy)
    by_hand = HivemindStrategy(target_batch_size=64)
    every = "average_state_every"
    assert by_agent._hivemind_kwargs[every] == by_hand._hivemind_kwargs[every] == 10
    own = split_strategy_options({"average_state_every": 1}, config).strategy
    assert HivemindStrategy(target_batch_size=64, **own)._hivemind_kwargs[every] == 1


def test_an_averaging_timeout_that_leaves_no_room_for_matchmaking_is_refused_at_construction() -> None:
    # hivemind would fail every worker's training at the first scheduled round with an AssertionError
    with pytest.raises(
        HivemindStrategyError, match=r"averaging_timeout .* must be longer than matchmaking_time"
    ):
        HivemindStrategy(target_batch_size=64, matchmaking_time=1.0, averaging_timeout=0.5)
    problem = strategy_option_problem({"matchmaking_time": 5.0, "averaging_timeout": 2.0})
    assert problem is not None and "must be longer than matchmaking_time" in problem


def test_a_value_of_the_wrong_type_for_a_strategy_keyword_is_refused_with_the_keyword() -> None:
    assert (
        strategy_option_problem({"matchmaking_time": "fast"})
        == "matchmaking_time: expected float, got 'fast'"
    )
    assert strategy_option_problem({"delay_state_averaging": "yes"}) == (
        "delay_state_averaging: expected bool, got 'yes'"
    )
    # what JSON gives for the annotations (an int is a float, a list a sequence); routed keywords pass
    assert strategy_option_problem({"matchmaking_time": 2, "initial_peers": ["/ip4/1.2.3.4"]}) is None
    assert strategy_option_problem({"use_relay": False, "averager_opts": {"bandwidth": 1e6}}) is None


@pytest.mark.parametrize(
    "options",
    [
        {"delay_optimizer_step": True},
        {"delay_grad_averaging": True},
        {"delay_grad_averaging": True, "delay_optimizer_step": False, "delay_state_averaging": True},
    ],
)
def test_delay_flags_that_do_not_go_together_are_refused_as_the_strategy_refuses_them(
    options: dict[str, Any],
) -> None:
    # the create-time probe and the agent ask strategy_option_problem; the strategy runs the same check
    with pytest.raises(HivemindStrategyError) as caught:
        HivemindStrategy(target_batch_size=64, **options)
    assert strategy_option_problem(options) == str(caught.value)
    assert (
        strategy_option_problem({**options, "delay_state_averaging": True, "delay_optimizer_step": True})
        is None
    )


def test_the_averagers_request_timeout_stays_below_the_matchmaking_time() -> None:
    assert averager_options(None, matchmaking_time=1.0) == {"request_timeout": 0.5}
    assert averager_options(None, matchmaking_time=30.0) == {"request_timeout": 3.0}  # hivemind's default
    given = {"request_timeout": 2.0, "bandwidth": 1e6}
    assert averager_options(given, matchmaking_time=1.0) == given


def test_both_averagers_wait_on_a_leader_for_less_than_the_matchmaking_time() -> None:
    """hivemind warns in every peer's log when they do not (and gives ``averager_opts`` to its state averager
    only: the strategy's optimizer passes them to the gradient averager too)."""
    strategy = make_strategy(target_batch_size=32)  # matchmaking_time 1.0, as the tests and the demo use
    make_trainer(strategy, max_steps=2).fit(DigitsModule(), digits(batch_size=32))
    for averager in (strategy.optimizer.grad_averager, strategy.optimizer.state_averager):
        kwargs = averager.matchmaking_kwargs
        assert kwargs["request_timeout"] == 0.5 < kwargs["min_matchmaking_time"] == 1.0
        assert averager.allreduce_kwargs["sender_timeout"] == 1.0  # hivemind's: matchmaking_time


def test_a_chunk_timeout_given_to_the_strategy_reaches_the_gradient_rounds() -> None:
    strategy = make_strategy(target_batch_size=32, next_chunk_timeout=7.0)
    make_trainer(strategy, max_steps=1).fit(DigitsModule(), digits(batch_size=32))
    assert strategy.optimizer.grad_averager.allreduce_kwargs["sender_timeout"] == 7.0
