"""DiLoCo rounds between real hivemind peers on 127.0.0.1 (``sync="diloco"``, worker/strategy/diloco/):
two peers hold the same weights after a round, a joiner weighs 0 in its first round, a round that breaks
after its group formed is discarded, a peer goes on training when its groupmate is killed mid-round, a
round that its swarm mates miss ends a matchmaking time after its moment, and joiners that meet only each
other average from their second round.

The peers are ``DiLoCoOptimizer``s on a tiny linear model (tests/support/diloco.py); the test calls each
round itself, in one thread per peer, so rounds start together without waiting for a clock.
"""

from __future__ import annotations

import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from hivemind.averaging.control import AveragingStage

from tests.support.diloco import AVERAGING_TIMEOUT_S, MATCHMAKING_S, Peer, diloco_peers, make_peer, start_dht
from tests.support.processes import ProcessRegistry
from tests.support.waiting import BOOT_S, wait_until
from worker.strategy.diloco.outer import OuterStep
from worker.strategy.outcomes import Outcome

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(300)]

#: fp16 pseudo-gradients (the default compression): each peer receives the others' parts of the mean
#: rounded to fp16, so two peers' weights agree to that precision, not bit for bit
FP16_TOLERANCE = 1e-3
ROUND_BOUND_S = 3 * AVERAGING_TIMEOUT_S


def see_each_other(peers: list[Peer]) -> None:
    for peer in peers:
        peer.train(1, seed=0)  # a progress record of its own in the DHT
    wait_until(
        lambda: all(p.optimizer.tracker.global_progress.num_peers == len(peers) for p in peers),
        30,
        message="each peer's tracker sees the others",
    )


def rounds_together(peers: list[Peer]) -> list[Outcome]:
    with ThreadPoolExecutor(len(peers)) as pool:
        futures = [pool.submit(p.optimizer.run_round) for p in peers]
        return [f.result(timeout=ROUND_BOUND_S) for f in futures]


def expected_global(peer: Peer, mean_pseudo_gradients: list[torch.Tensor]) -> torch.Tensor:
    """``peer``'s global weights after an outer step with ``mean_pseudo_gradients`` (a copy steps)."""
    outer = peer.optimizer.outer
    copy = OuterStep(
        outer.global_params, outer.optimizer.defaults["lr"], outer.optimizer.defaults["momentum"]
    )
    copy.load_state_dict(outer.state_dict())
    copy.apply(mean_pseudo_gradients)
    return torch.cat([g.detach().flatten() for g in copy.global_params])


def test_two_peers_hold_the_same_weights_after_a_round_stepped_by_their_weighted_mean() -> None:
    with diloco_peers(2) as (a, b):
        see_each_other([a, b])
        for peer in (a, b):
            peer.optimizer.samples_in_round = 0
        a.train(5, seed=1)  # 80 samples
        b.train(3, seed=2)  # 48 samples
        pseudo = [p.optimizer.outer.pseudo_gradients(list(p.model.parameters())) for p in (a, b)]
        mean = [(80 * x + 48 * y) / 128 for x, y in zip(pseudo[0], pseudo[1], strict=True)]
        expected = expected_global(a, mean)

        assert rounds_together([a, b]) == [Outcome.averaged, Outcome.averaged]
        for peer in (a, b):
            assert torch.equal(peer.flat(), peer.global_flat())  # each trains on from the new global weights
            torch.testing.assert_close(peer.flat(), expected, atol=FP16_TOLERANCE, rtol=0)
        assert a.optimizer.local_epoch == b.optimizer.local_epoch == 1
        assert [kept_samples(p) for p in (a, b)] == [80, 48]  # each one's samples went into the model


def kept_samples(peer: Peer) -> int:
    """The samples ``peer`` reports as gone into the model (its heartbeats' ``kept_samples``)."""
    return peer.optimizer.outcomes.counter.snapshot().kept_samples


def test_a_joiner_downloads_the_global_state_and_weighs_nothing_in_its_first_round() -> None:
    first_dht = start_dht()
    first = make_peer(first_dht)
    try:
        first.train(4, seed=1)
        alone_samples = first.optimizer.samples_in_round
        assert first.optimizer.run_round() is Outcome.alone
        assert kept_samples(first) == alone_samples > 0  # alone, its outer step still takes them
        first.train(3, seed=2)  # keeps training: its pseudo-gradient of this round is all that counts
        joiner_dht = start_dht([str(m) for m in first_dht.get_visible_maddrs()])
        joiner = make_peer(joiner_dht)
        try:
            assert joiner.optimizer.load_state_from_peers()
            assert torch.equal(joiner.global_flat(), first.global_flat())
            assert torch.equal(joiner.flat(), first.global_flat())
            assert joiner.optimizer.local_epoch == 1
            see_each_other([first, joiner])
            joiner.train(6, seed=3)  # trains as much as the first, on other data: it must not count
            own = first.optimizer.outer.pseudo_gradients(list(first.model.parameters()))
            expected = expected_global(first, own)
            first_samples = first.optimizer.samples_in_round

            assert rounds_together([first, joiner]) == [Outcome.averaged, Outcome.averaged]
            assert kept_samples(first) == alone_samples + first_samples
            assert kept_samples(joiner) == 0  # its first round weighed nothing: none of its samples kept
            for peer in (first, joiner):
                torch.testing.assert_close(peer.flat(), expected, atol=FP16_TOLERANCE, rtol=0)
            assert first.optimizer.local_epoch == joiner.optimizer.local_epoch == 2
        finally:
            joiner.optimizer.shutdown()
            joiner_dht.shutdown()
    finally:
        first.optimizer.shutdown()
        first_dht.shutdown()


def test_a_round_that_breaks_after_its_group_formed_is_discarded_back_to_the_global_weights() -> None:
    with diloco_peers(2) as (a, b):
        see_each_other([a, b])
        a.train(5, seed=1)
        global_before = a.global_flat().clone()
        assert not torch.equal(a.flat(), global_before)
        # b joins the round's group and never lets its all-reduce start: a's all-reduce cannot finish
        stalled = b.optimizer.averager.step(
            gather={"epoch": 0}, weight=1.0, timeout=AVERAGING_TIMEOUT_S, require_trigger=True, wait=False
        )
        try:
            outcome = a.optimizer.run_round()
        finally:
            stalled.cancel()
        assert outcome in (Outcome.failed, Outcome.timeout)
        assert torch.equal(a.flat(), global_before)  # local weights back to the global copy
        assert torch.equal(a.global_flat(), global_before)
        assert a.optimizer.local_epoch == 0
        assert kept_samples(a) == 0  # the discarded round's samples are lost work


def _status(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def test_a_peer_goes_on_when_its_groupmate_is_killed_mid_round(
    processes: ProcessRegistry, tmp_path: Path
) -> None:
    dht = start_dht()
    a = make_peer(dht)
    outcomes: list[Outcome] = []
    stop = threading.Event()

    def train_in_rounds() -> None:
        while not stop.is_set():
            a.train(5, seed=len(outcomes))
            outcomes.append(a.optimizer.run_round())

    trainer = threading.Thread(target=train_in_rounds, name="peer-a")
    try:
        status = tmp_path / "b.json"
        maddr = str(dht.get_visible_maddrs()[0])
        b = processes.start(
            "b", [sys.executable, "-m", "tests.programs.diloco_peer", maddr, str(status)], preloaded=True
        )
        wait_until(lambda: _status(status).get("rounds", 0) >= 0 and status.exists(), BOOT_S, message=b.log)
        trainer.start()
        wait_until(lambda: Outcome.averaged in outcomes, 60, message=lambda: f"{outcomes}\n{b.log()}")
        done = _status(status)["rounds"]
        wait_until(lambda: _status(status)["rounds"] > done, 30, message="b enters another round")
        b.kill()  # SIGKILL to its process group, in a round or right before one: no goodbye
        after_kill = len(outcomes)
        wait_until(
            lambda: Outcome.alone in outcomes[after_kill:] and outcomes[-1] is Outcome.alone,
            60,
            message=lambda: f"a trains on alone once b's record expires: {outcomes}",
        )
        assert bool(torch.isfinite(a.flat()).all())
        assert a.optimizer.local_epoch >= 2
    finally:
        stop.set()
        if trainer.is_alive():
            trainer.join(ROUND_BOUND_S)
        a.optimizer.shutdown()
        dht.shutdown()


def test_peers_that_train_on_meet_in_rounds_on_the_swarms_clock() -> None:
    """``sync_every_s``: rounds due at the same multiples of the DHT clock, matchmaking scheduled ahead
    while the peers compute; nobody calls ``run_round`` by hand."""
    with diloco_peers(2, sync_every_steps=None, sync_every_s=3.0) as peers:
        stop = threading.Event()

        def train_on(peer: Peer, seed: int) -> None:
            while not stop.is_set():
                peer.train(1, seed=seed)

        threads = [
            threading.Thread(target=train_on, args=(peer, i), name=f"peer-{i}")
            for i, peer in enumerate(peers)
        ]
        for thread in threads:
            thread.start()
        try:
            wait_until(
                lambda: all(p.optimizer.outcomes.counter.snapshot().averaged >= 2 for p in peers),
                60,
                message=lambda: str([p.optimizer.outcomes.counter.snapshot() for p in peers]),
            )
        finally:
            stop.set()
            for thread in threads:
                thread.join(ROUND_BOUND_S)
        epochs = [p.optimizer.local_epoch for p in peers]
        assert min(epochs) >= 2 and max(epochs) - min(epochs) <= 1, epochs


def test_a_peer_whose_swarm_mates_miss_its_round_waits_no_longer_than_the_matchmaking_time() -> None:
    """A round's group forms at its boundary, or the round ends a matchmaking time later without one
    (``no_group``) and the peer trains on, its round merged into the next. Seen with a joiner whose first
    round came a boundary later than the swarm's (it joined less than the matchmaking lead before one):
    the others, counting it as a peer, looked for a group until ``averaging_timeout`` (30 s by default,
    with rounds every 30 s: a whole round of compute lost by every peer at every join). Here peer b trains
    in the swarm on a schedule that never meets a's rounds, so each of a's rounds finds nobody."""
    dht_a = start_dht()
    a = make_peer(dht_a, sync_every_steps=None, sync_every_s=3.0)
    dht_b = start_dht([str(m) for m in dht_a.get_visible_maddrs()])
    b = make_peer(dht_b, sync_every_steps=None, sync_every_s=1e7)  # its first round is months away
    stop = threading.Event()

    def train_on(peer: Peer) -> None:
        while not stop.is_set():
            peer.train(1, seed=0)

    threads = [threading.Thread(target=train_on, args=(p,), name=f"peer-{i}") for i, p in enumerate((a, b))]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: a.optimizer.tracker.global_progress.num_peers == 2, 30, message="a sees b")
        rounds, blocked_s = a.optimizer.rounds, a.optimizer.round_s_total
        wait_until(lambda: a.optimizer.rounds >= rounds + 2, 60, message="two rounds of a with b in sight")
        mean_blocked_s = (a.optimizer.round_s_total - blocked_s) / (a.optimizer.rounds - rounds)
    finally:
        stop.set()
        for thread in threads:
            thread.join(ROUND_BOUND_S)
        for peer in (a, b):
            peer.optimizer.shutdown()
            peer.dht.shutdown()
    counts = a.optimizer.outcomes.counter.snapshot()
    assert counts.no_group >= 2 and counts.averaged == 0, counts
    # the round's matchmaking time after its boundary, and the time to learn that no group formed
    assert mean_blocked_s < 2.5 * MATCHMAKING_S, f"each round blocked a's training {mean_blocked_s:.1f} s"


def test_a_peer_told_to_leave_mid_round_ends_the_round_its_group_formed_for() -> None:
    """A spot notice's leave can land while the worker's last round is averaging. Calling that round
    off lost the whole round's training (discarded back to the global weights) and broke the round of
    every groupmate; a peer that leaves ends it, and only a round still looking for its group is off."""
    with diloco_peers(2) as (a, b):
        see_each_other([a, b])
        a.train(5, seed=1)
        samples = a.optimizer.samples_in_round
        # b joins a's group but holds its all-reduce back until a was told to leave
        held = b.optimizer.averager.step(
            gather={"epoch": 0}, weight=1.0, timeout=AVERAGING_TIMEOUT_S, require_trigger=True, wait=False
        )
        with ThreadPoolExecutor(1) as pool:
            round_of_a = pool.submit(a.optimizer.run_round)
            wait_until(lambda: held.stage is AveragingStage.AWAITING_TRIGGER, 30, message="the group forms")
            a.optimizer.leave_rounds()
            held.allow_allreduce()
            outcome = round_of_a.result(timeout=ROUND_BOUND_S)
        assert held.result(timeout=ROUND_BOUND_S) is not None  # b's round went through
        assert outcome is Outcome.averaged
        assert a.optimizer.local_epoch == 1
        assert kept_samples(a) == samples > 0  # its round's training went into the model
        assert torch.equal(a.flat(), a.global_flat())


def test_joiners_that_meet_only_each_other_average_from_their_second_round() -> None:
    """Two workers that joined while the swarm had one peer, which then died (a kill -9 of the last
    veteran, with replacements booting): each downloaded the global state and weighs 0 in its next round,
    so their first round together has no weight at all and is discarded. It used to be discarded again
    at every round after (each kept weighing 0 until a round of its counted), and the swarm's epoch stood
    still for good; after the discard both are back on the same global weights, so they weigh their
    samples from the next round on."""
    first_dht = start_dht()
    first = make_peer(first_dht)
    joiners: list[Peer] = []
    try:
        first.train(4, seed=1)
        assert first.optimizer.run_round() is Outcome.alone
        maddrs = [str(m) for m in first_dht.get_visible_maddrs()]
        joiners = [make_peer(start_dht(maddrs)) for _ in range(2)]
        for joiner in joiners:
            assert joiner.optimizer.load_state_from_peers()
            assert joiner.optimizer.local_epoch == 1
        first.optimizer.shutdown()  # its progress record goes with it: the joiners are the swarm
        first_dht.shutdown()
        see_each_other(joiners)
        for joiner, seed in zip(joiners, (2, 3), strict=True):
            joiner.train(4, seed=seed)
        assert rounds_together(joiners) == [Outcome.failed, Outcome.failed]  # no weight in the group
        global_weights = joiners[0].global_flat().clone()
        for joiner in joiners:
            assert torch.equal(joiner.flat(), global_weights)  # back to the global weights, the same

        a, b = joiners
        for peer in joiners:
            peer.optimizer.samples_in_round = 0
        a.train(5, seed=4)  # 80 samples
        b.train(3, seed=5)  # 48 samples
        pseudo = [p.optimizer.outer.pseudo_gradients(list(p.model.parameters())) for p in joiners]
        mean = [(80 * x + 48 * y) / 128 for x, y in zip(pseudo[0], pseudo[1], strict=True)]
        expected = expected_global(a, mean)
        assert rounds_together(joiners) == [Outcome.averaged, Outcome.averaged]
        for peer in joiners:
            torch.testing.assert_close(peer.flat(), expected, atol=FP16_TOLERANCE, rtol=0)
        assert a.optimizer.local_epoch == b.optimizer.local_epoch == 2
        assert [kept_samples(p) for p in joiners] == [80, 48]
    finally:
        for joiner in joiners:
            joiner.optimizer.shutdown()
            joiner.dht.shutdown()
        if first.optimizer.is_alive():
            first.optimizer.shutdown()
        first_dht.shutdown()
