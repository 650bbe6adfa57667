"""Averaging rounds that succeed between two peers that start together, with the strategy as it ships and
with one of its matchmaking fixes (``worker/_hivemind_compat.py``) left out.

While a swarm forms, each new peer briefly thinks it is alone and calls off the averaging rounds it had
pre-scheduled. hivemind cancels the matchmaking task of such a round without awaiting it; the garbage
collector can then destroy it half-way, leaving the averager's matchmaking lock held, and that
averager finds no group again for the rest of the run. ``HivemindStrategy`` keeps those tasks alive.
This script measures both side by side in one run; the variants alternate trial by trial, so a machine
that gets busier meanwhile hurts both alike. ``--left-out bound`` measures another fix the same way: the
matchmaking DHT calls bounded with ``asyncio.wait_for``, as before commit b6300b0, which swallowed the
cancellation of a leader's search as its group was assembled (the leader then sat out its own round until
its deadline, and both peers' trainers waited out the averaging timeout in turn).

Each trial: a bootstrap DHT peer (as the orchestrator runs), then two forked peers that join it at the
same moment and train the digits example for ``--seconds`` (matchmaking 1 s, averaging timeout 10 s, as
the demo and the tests use). Each peer's stderr, where hivemind and its averager processes log, goes
to a file; with ``verbose=True`` hivemind logs "Transitioning to epoch" for each epoch, "Averaged
gradients with N peers" for each epoch on averaged gradients, and "could not find a group" for each
round that formed no group. Epochs a peer trains while it still thinks it is alone (the first second or
two) count as not averaged in both variants.

``python bench/matchmaking.py --trials 3 --seconds 40 [--left-out keep-alive|bound]``
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.forked_peers import become_peer, kill_peers

AVERAGED_LINE = "Averaged gradients with"
EPOCH_LINE = "Transitioning to epoch"
NO_GROUP_LINE = "could not find a group"
#: per fix that can be left out: how the trials without it and with it are named
VARIANTS = {
    "keep-alive": {False: "hivemind as is", True: "with keep-alive"},
    "bound": {False: "bound by wait_for", True: "bound by timeout"},
}


def bound_by_wait_for() -> None:
    """The matchmaking DHT calls bounded as the strategy did before b6300b0, in this (forked) peer."""
    from hivemind.averaging.key_manager import GroupKeyManager

    from worker._hivemind_compat import MATCHMAKING_DHT_TIMEOUT_S

    def bounded(method: Any, fallback: Any) -> Any:
        async def within_bound(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:  # the old bound, on purpose: what this variant measures
                return await asyncio.wait_for(method(self, *args, **kwargs), MATCHMAKING_DHT_TIMEOUT_S)  # noqa: TID251
            except TimeoutError:
                return fallback()

        return within_bound

    GroupKeyManager.declare_averager = bounded(GroupKeyManager.declare_averager, bool)  # type: ignore[method-assign]
    GroupKeyManager.get_averagers = bounded(GroupKeyManager.get_averagers, list)  # type: ignore[method-assign]


@dataclass
class Outcome:
    epochs: int = 0
    averaged: int = 0
    no_group: int = 0

    def add(self, other: Outcome) -> None:
        self.epochs += other.epochs
        self.averaged += other.averaged
        self.no_group += other.no_group

    @property
    def averaged_share(self) -> float:
        return self.averaged / self.epochs if self.epochs else 0.0


def run_peer(
    log_path: str, initial_peers: list[str], run_id: str, args: argparse.Namespace, keep: bool
) -> None:
    """One peer (a forked child): its own process group, stderr to ``log_path``, trains until time is up."""
    become_peer(log_path, stdout=False)
    import torch
    from lightning.pytorch import Trainer

    import worker.strategy.optimizer
    from worker.examples.digits import DigitsDataModule, DigitsModule
    from worker.protocol.trainer import NO_VALIDATION, QUIET
    from worker.strategy import HivemindStrategy

    if not keep and args.left_out == "keep-alive":  # the baseline: hivemind's averagers as they are
        worker.strategy.optimizer.keep_averager_tasks_alive = lambda: None  # type: ignore[assignment]
    if not keep and args.left_out == "bound":  # the baseline: the bound before b6300b0
        worker.strategy.optimizer.bound_matchmaking_dht_calls = bound_by_wait_for  # type: ignore[assignment]
    torch.set_num_threads(1)
    strategy = HivemindStrategy(
        target_batch_size=args.target_batch_size,
        run_id=run_id,
        initial_peers=initial_peers,
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        matchmaking_time=1.0,
        averaging_timeout=10.0,
        verbose=True,
    )
    limit = {"seconds": args.seconds}
    trainer = Trainer(
        strategy=strategy, accelerator="cpu", max_epochs=-1, max_time=limit, **QUIET, **NO_VALIDATION
    )
    trainer.fit(DigitsModule(hidden=32, lr=0.05), DigitsDataModule(batch_size=args.batch_size))


def read_outcome(log_path: Path) -> Outcome:
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    return Outcome(text.count(EPOCH_LINE), text.count(AVERAGED_LINE), text.count(NO_GROUP_LINE))


def trial(args: argparse.Namespace, keep: bool, index: int, workdir: Path) -> Outcome:
    import hivemind

    bootstrap = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    peers = [str(addr) for addr in bootstrap.get_visible_maddrs()]
    context = mp.get_context("fork")  # hivemind cannot be pickled into a spawned process
    name = "keepalive" if keep else "asis"
    logs = [workdir / f"{name}-{index}-peer{p}.log" for p in range(2)]
    run_id = f"mm-{name}-{index}"
    procs = [context.Process(target=run_peer, args=(str(log), peers, run_id, args, keep)) for log in logs]
    try:
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + args.seconds + 120
        for proc in procs:
            proc.join(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        kill_peers(procs)
        bootstrap.shutdown()
    outcome = Outcome()
    for log in logs:
        outcome.add(read_outcome(log))
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trials", type=int, default=3, help="trials per variant (they alternate)")
    parser.add_argument("--seconds", type=int, default=40, help="training time of each peer per trial")
    parser.add_argument("--target-batch-size", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--logs", type=Path, help="keep the peers' logs in this folder")
    parser.add_argument("--left-out", choices=sorted(VARIANTS), default="keep-alive", help="the fix measured")
    args = parser.parse_args()
    variants = VARIANTS[args.left_out]
    totals = {False: Outcome(), True: Outcome()}
    with tempfile.TemporaryDirectory(prefix="spotswarm-matchmaking-") as tmp:
        workdir = args.logs or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for index in range(args.trials):
            for keep in (False, True):
                outcome = trial(args, keep, index, workdir)
                totals[keep].add(outcome)
                print(
                    f"trial {index + 1}/{args.trials}, {variants[keep]}: {outcome.epochs} peer-epochs, "
                    f"{outcome.averaged} on averaged gradients, {outcome.no_group} rounds without a group",
                    flush=True,
                )
    print(f"\n2 peers started together, {args.trials} trials of {args.seconds} s per variant")
    print("| averagers | peer-epochs | on averaged gradients | rounds without a group |")
    print("| --- | ---: | ---: | ---: |")
    for keep, total in totals.items():
        share = f"{total.averaged} ({total.averaged_share:.0%})"
        print(f"| {variants[keep]} | {total.epochs} | {share} | {total.no_group} |")
    base, fixed = totals[False].averaged_share, totals[True].averaged_share
    if base > 0:
        print(f"averaged share, {variants[True]} / {variants[False]}: {fixed / base:.2f}x")
    else:
        print(f"averaged share: {variants[False]} 0%, {variants[True]} {fixed:.0%}")


if __name__ == "__main__":
    sys.exit(main())
