"""A swarm on this machine: N processes train the digits example together with HivemindStrategy.

``python -m worker.examples.local_swarm --peers 2 --seconds 60``

Peer 0 starts a new swarm on 127.0.0.1; the others join it through the address it reports. Each peer
is a forked process in its own process group (its hivemind daemons with it) and prints, every few
seconds, its loss and what it sees of the swarm. Ctrl-C (or the end of ``--seconds``) stops them:
SIGTERM to each group, a grace period for a clean goodbye to the swarm, then SIGKILL.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing as mp
import os
import queue
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.process import BaseProcess
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.exceptions import SIGTERMException

from worker._hivemind_compat import own_mpfuture_locks
from worker.examples.digits import DigitsDataModule, DigitsModule
from worker.protocol.trainer import NO_VALIDATION, QUIET
from worker.strategy import HivemindStrategy

STOP_GRACE_S = 20.0


@dataclass(frozen=True)
class PeerConfig:
    index: int
    seconds: float
    target_batch_size: int
    batch_size: int
    report_every_s: float
    initial_peers: tuple[str, ...]


class Reporter(Callback):
    """Sends the peer's addresses once, then its loss and swarm view every ``every_s`` seconds."""

    def __init__(self, index: int, reports: mp.Queue, every_s: float) -> None:
        self.index, self.reports, self.every_s = index, reports, every_s
        self.next_at = 0.0

    def on_train_start(self, trainer: Trainer, module: LightningModule) -> None:
        strategy: HivemindStrategy = trainer.strategy  # type: ignore[assignment]
        self.reports.put(("maddrs", self.index, strategy.visible_maddrs()))

    def on_train_batch_end(self, trainer: Trainer, module: LightningModule, outputs: Any, *args: Any) -> None:
        if time.monotonic() < self.next_at:
            return
        self.next_at = time.monotonic() + self.every_s
        strategy: HivemindStrategy = trainer.strategy  # type: ignore[assignment]
        progress = strategy.swarm_progress()
        self.reports.put(("progress", self.index, float(outputs["loss"]), progress, strategy.local_samples))


def local_trainer(
    run_id: str,
    target_batch_size: int,
    initial_peers: str | Sequence[str] | None,
    seconds: float,
    callbacks: list[Callback],
    **strategy_options: Any,
) -> Trainer:
    """A quiet CPU trainer for ``seconds`` whose HivemindStrategy starts or joins (``initial_peers``) the
    swarm ``run_id`` of peers on this machine: its DHT on 127.0.0.1, hivemind's waits cut to what one
    machine needs (1 s to form a group, 10 s for a round); ``strategy_options`` go to the strategy."""
    strategy = HivemindStrategy(
        target_batch_size=target_batch_size,
        run_id=run_id,
        initial_peers=initial_peers,
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        matchmaking_time=1.0,
        averaging_timeout=10.0,
        **strategy_options,
    )
    return Trainer(
        strategy=strategy,
        accelerator="cpu",
        max_epochs=-1,
        max_time=timedelta(seconds=seconds),
        callbacks=callbacks,
        **QUIET,
        **NO_VALIDATION,
    )


def run_peer(config: PeerConfig, reports: mp.Queue) -> None:
    """One peer: its own session (so its group can be signalled) and hivemind locks (so a peer killed
    while holding one cannot block the others), then train until time is up."""
    os.setsid()
    own_mpfuture_locks()
    logging.basicConfig(
        level=logging.WARNING, format=f"[peer {config.index}] %(name)s %(levelname)s %(message)s"
    )
    torch.set_num_threads(1)
    reporter = Reporter(config.index, reports, config.report_every_s)
    trainer = local_trainer(
        "local_swarm", config.target_batch_size, list(config.initial_peers), int(config.seconds), [reporter]
    )
    # SIGTERMException: asked to stop, Lightning has already torn the strategy down
    with contextlib.suppress(SIGTERMException):
        trainer.fit(DigitsModule(hidden=64, lr=0.01), DigitsDataModule(batch_size=config.batch_size))
    reports.put(("done", config.index, trainer.callback_metrics.get("train_loss")))


def _format(report: tuple[Any, ...]) -> str:
    _, index, loss, progress, local_samples = report
    return (
        f"peer {index} | loss {loss:.4f} | swarm epoch {progress.epoch} | peers {progress.num_peers} | "
        f"{progress.samples_per_second:8.1f} samples/s | {progress.samples_accumulated}/"
        f"{progress.target_batch_size} towards next epoch | contributed {local_samples}"
    )


def _stop(processes: list[BaseProcess]) -> None:
    """SIGTERM each peer's process group, wait out the grace period, SIGKILL what is left."""
    for process in processes:
        if process.pid is not None and process.is_alive():
            _signal_group(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for process in processes:
        process.join(max(0.1, deadline - time.monotonic()))
    for process in processes:
        if process.pid is not None:
            _signal_group(process.pid, signal.SIGKILL)  # daemons that outlived their peer, if any
        process.join(1.0)


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--peers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=60.0, help="training time of each peer")
    parser.add_argument("--target-batch-size", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--report-every", type=float, default=3.0, help="seconds between a peer's reports")
    args = parser.parse_args(argv)
    context = mp.get_context("fork")  # hivemind needs fork; the heavy imports above are shared
    reports: mp.Queue = context.Queue()

    def start(index: int, initial_peers: tuple[str, ...]) -> BaseProcess:
        config = PeerConfig(
            index, args.seconds, args.target_batch_size, args.batch_size, args.report_every, initial_peers
        )
        process = context.Process(target=run_peer, args=(config, reports), name=f"peer-{index}")
        process.start()
        return process

    processes = [start(0, ())]
    done: set[int] = set()
    try:
        while len(done) < args.peers:
            try:
                report = reports.get(timeout=1.0)
            except queue.Empty:
                if not any(p.is_alive() for p in processes):
                    break
                continue
            kind, index = report[0], report[1]
            if kind == "maddrs" and index == 0:
                print(f"peer 0 started the swarm: INITIAL_PEERS={','.join(report[2])}", flush=True)
                processes += [start(i, tuple(report[2])) for i in range(1, args.peers)]
            elif kind == "progress":
                print(_format(report), flush=True)
            elif kind == "done":
                done.add(index)
                print(f"peer {index} finished (last loss {report[2]})", flush=True)
    except KeyboardInterrupt:
        print("stopping the swarm...", file=sys.stderr, flush=True)
    finally:
        _stop(processes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
