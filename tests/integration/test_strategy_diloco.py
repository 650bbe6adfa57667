"""The DiLoCo mode of HivemindStrategy on one peer: the outer update rule against a plain-torch reference,
the options refused at construction and at create time, a lone peer's rounds in a real fit, and a
checkpoint saved mid-round (the global weights as its model, the local ones resumed). Rounds between
real peers: tests/integration/test_diloco_rounds.py."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
import torch

from tests.support.diloco import reference_outer_steps
from tests.support.strategy import SGDDigits, fixed_loader, flat_params, make_strategy, make_trainer
from worker.protocol.checkpoints import exported
from worker.strategy import HivemindStrategyError
from worker.strategy.diloco.outer import OuterStep, weighted_mean
from worker.strategy.diloco.schedule import RoundSchedule
from worker.strategy.diloco.settings import DiLoCoSettings, round_matchmaking_s
from worker.strategy.options import strategy_option_problem

pytestmark = pytest.mark.timeout(240)


def test_outer_step_matches_the_update_rule_for_two_workers_with_exact_numbers() -> None:
    # one weight at 1.0; round 1: worker A ends at 0.8 after 1 sample, B at 0.5 after 3 samples;
    # round 2: A and B move by +-0.1 with 2 samples each (their mean pseudo-gradient is 0: momentum only)
    start = [torch.tensor([1.0], dtype=torch.float64)]
    rounds = [
        [
            ([torch.tensor([0.2], dtype=torch.float64)], 1.0),
            ([torch.tensor([0.5], dtype=torch.float64)], 3.0),
        ],
        [
            ([torch.tensor([0.1], dtype=torch.float64)], 2.0),
            ([torch.tensor([-0.1], dtype=torch.float64)], 2.0),
        ],
    ]
    outer = OuterStep(start, lr=0.7, momentum=0.9)
    local = [start[0].clone()]
    seen = []
    for workers in rounds:
        deltas, weights = zip(*workers, strict=True)
        outer.apply(weighted_mean(deltas, weights))
        outer.copy_into(local)
        seen.append(float(local[0]))
    # by hand: g = (0.2 + 3 * 0.5) / 4 = 0.425, buf = g, step 0.7 * (g + 0.9 * buf) = 0.56525
    # then g = 0, buf = 0.9 * 0.425 = 0.3825, step 0.7 * 0.9 * 0.3825 = 0.240975
    assert seen == pytest.approx([0.43475, 0.193775], abs=1e-12)
    reference = reference_outer_steps(start, rounds, lr=0.7, momentum=0.9)
    assert seen == pytest.approx([float(r[0]) for r in reference], abs=1e-12)


def test_outer_state_round_trips_through_its_state_dict() -> None:
    params = [torch.arange(4, dtype=torch.float32)]
    outer = OuterStep(params, lr=0.7, momentum=0.9)
    outer.apply([torch.ones(4)])
    other = OuterStep([torch.zeros(4)], lr=0.7, momentum=0.9)
    other.load_state_dict(outer.state_dict())
    outer.apply([torch.ones(4)])
    other.apply([torch.ones(4)])
    assert torch.equal(outer.global_params[0], other.global_params[0])  # momentum came along


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"sync": "dilocco"}, "sync must be one of"),
        ({"sync_every_s": 10}, "applies only with sync='diloco'"),
        ({"sync": "diloco", "sync_every_s": 0}, "sync_every_s must be a positive number"),
        ({"sync": "diloco", "sync_every_steps": 0}, "sync_every_steps must be a positive int"),
        ({"sync": "diloco", "sync_every_s": 5, "sync_every_steps": 5}, "not both"),
        ({"sync": "diloco", "outer_momentum": 1.0}, "outer_momentum must be a number in [0, 1)"),
        ({"sync": "diloco", "outer_lr": -1}, "outer_lr must be a positive number"),
        (
            {"sync": "diloco", "offload_optimizer": True},
            "offload_optimizer does not apply with sync='diloco'",
        ),
    ],
)
def test_wrong_sync_options_are_refused_at_create_time_and_by_the_strategy(
    options: dict[str, object], says: str
) -> None:
    problem = strategy_option_problem(options)
    assert problem is not None and says in problem
    with pytest.raises(HivemindStrategyError, match=re.escape(says)):
        make_strategy(**options)


def test_good_sync_options_pass_the_create_time_check() -> None:
    for options in (
        {"sync": "diloco"},
        {"sync": "local"},
        {"sync": "diloco", "sync_every_s": 20, "outer_lr": 0.5},
    ):
        assert strategy_option_problem(options) is None


def test_a_lone_diloco_peer_steps_its_outer_optimizer_every_round(tmp_path: Path) -> None:
    strategy = make_strategy(target_batch_size=32, sync="diloco", sync_every_steps=3)
    module = SGDDigits()
    trainer = make_trainer(strategy, max_steps=12, default_root_dir=tmp_path)
    trainer.fit(module, train_dataloaders=fixed_loader())
    counts = strategy.averaging_outcomes()
    assert counts is not None and counts.alone == 4 and counts.averaged == 0
    assert strategy.optimizer.local_epoch == 4  # the swarm epoch counts rounds
    assert strategy.optimizer.rounds == 4 and strategy.optimizer.round_s_total > 0  # type: ignore[union-attr]
    # the rounds' blocking time reaches the heartbeat's counts, for the run's G and waiting share
    assert 0 < counts.averaging_s <= counts.train_s
    assert counts.averaging_s == pytest.approx(strategy.optimizer.round_s_total, abs=1e-3)  # type: ignore[union-attr]
    optimizer = strategy.optimizer
    global_weights = torch.cat([g.detach().flatten() for g in optimizer.outer.global_params])  # type: ignore[union-attr]
    assert torch.equal(global_weights, flat_params(module))  # a round ends with the local weights = global


def test_a_checkpoint_mid_round_holds_the_global_weights_as_its_model_and_resumes_the_local_ones(
    tmp_path: Path,
) -> None:
    first = make_strategy(target_batch_size=32, sync="diloco", sync_every_steps=3)
    module = SGDDigits()
    trainer = make_trainer(
        first, max_steps=7, default_root_dir=tmp_path
    )  # 2 rounds, then 1 step into the 3rd
    trainer.fit(module, train_dataloaders=fixed_loader())
    path = tmp_path / "mid.ckpt"
    trainer.save_checkpoint(path)
    saved_global = [g.detach().clone() for g in first.optimizer.outer.global_params]  # type: ignore[union-attr]
    saved_momentum = first.optimizer.outer.momentum_buffers()  # type: ignore[union-attr]
    saved_local = flat_params(module)
    assert first.optimizer.local_epoch == 2
    global_flat = torch.cat([g.flatten() for g in saved_global])
    assert not torch.equal(global_flat, saved_local)  # one inner step into the round: they differ
    checkpoint = torch.load(path, weights_only=True)
    stored = torch.cat([t.flatten() for t in checkpoint["state_dict"].values()])
    assert torch.equal(stored, global_flat)  # the run's model is the global copy, not the local weights
    export = exported(checkpoint, run="r", checkpoint_epoch=2)
    assert torch.equal(torch.cat([t.flatten() for t in export["state_dict"].values()]), global_flat)
    assert set(export["optimizer_states"][0]) == {"state", "param_groups"}  # a plain torch optimizer's

    second = make_strategy(target_batch_size=32, sync="diloco", sync_every_steps=3)
    resumed = make_trainer(second, max_steps=13, default_root_dir=tmp_path)  # 6 more steps: 2 more rounds
    seen: dict[str, object] = {}

    def on_train_start() -> None:
        outer = second.optimizer.outer  # type: ignore[union-attr]
        seen["epoch"] = second.optimizer.local_epoch
        seen["local"] = torch.equal(flat_params(resumed_module), saved_local)
        seen["global"] = all(
            torch.equal(a, b) for a, b in zip(outer.global_params, saved_global, strict=True)
        )
        seen["momentum"] = all(
            torch.equal(a, b) for a, b in zip(outer.momentum_buffers(), saved_momentum, strict=True)
        )

    resumed_module = SGDDigits()
    resumed_module.on_train_start = on_train_start  # type: ignore[method-assign]
    resumed.fit(resumed_module, train_dataloaders=fixed_loader(), ckpt_path=path)
    assert seen == {"epoch": 2, "local": True, "global": True, "momentum": True}
    assert second.optimizer.local_epoch == 4


def test_local_sync_steps_the_optimizer_every_batch_between_swarm_epochs(tmp_path: Path) -> None:
    strategy = make_strategy(target_batch_size=96, sync="local")  # a swarm epoch every 3 batches of 32
    module = SGDDigits()
    seen: list[torch.Tensor] = []
    module.on_train_batch_end = lambda *_: seen.append(flat_params(module))  # type: ignore[method-assign]
    trainer = make_trainer(strategy, max_steps=6, default_root_dir=tmp_path)
    trainer.fit(module, train_dataloaders=fixed_loader())
    assert strategy.optimizer.use_local_updates  # type: ignore[union-attr]
    assert len(seen) == 6
    assert all(not torch.equal(a, b) for a, b in itertools.pairwise(seen))  # every batch moved it


def test_rounds_by_time_come_every_interval_however_long_the_matchmaking_time() -> None:
    # hivemind's default matchmaking (5 s) as long as the interval: the lead is cut to half the interval,
    # so a round that ends just after its boundary is followed by the next boundary, not the one after
    now = [100.2]
    settings = DiLoCoSettings(sync_every_s=5.0)
    lead = round_matchmaking_s(settings, 5.0)
    assert lead == 2.5 and round_matchmaking_s(settings, 1.0) == 1.0
    assert round_matchmaking_s(DiLoCoSettings(sync_every_steps=10), 5.0) == 5.0  # by steps: no clock
    schedule = RoundSchedule(settings, lead_s=lead, clock=lambda: now[0])
    rounds = []
    while now[0] < 130:
        now[0] += 0.1  # a step
        if schedule.due():
            rounds.append(schedule.round_at)
            now[0] += 0.5  # the round itself
            schedule.next_round()
    assert rounds == [105.0, 110.0, 115.0, 120.0, 125.0, 130.0]


def test_every_peer_takes_every_boundary_however_little_time_is_left_to_it() -> None:
    # A peer that joins, or ends a round, less than the matchmaking lead before a boundary takes that
    # boundary and starts matching at once. Taking the one after left it a round out of phase with the
    # peers already there, who then looked for it in vain (the round's whole deadline, every join).
    now = [109.6]
    settings = DiLoCoSettings(sync_every_s=5.0)
    joiner = RoundSchedule(settings, lead_s=1.0, clock=lambda: now[0])
    assert joiner.round_at == 110.0 and joiner.time_to_schedule() and not joiner.due()
    now[0] = 110.0
    assert joiner.due()
    now[0] = 114.3  # the round ended late, 0.7 s before the next boundary
    joiner.next_round()
    assert joiner.round_at == 115.0 and joiner.time_to_schedule()
    now[0] = 121.0  # it overran a whole interval: the first boundary still ahead
    joiner.next_round()
    assert joiner.round_at == 125.0 and not joiner.time_to_schedule()
    now[0] = 130.0  # exactly on a boundary: no time at all to match for it, so the next one
    joiner.next_round()
    assert joiner.round_at == 135.0
