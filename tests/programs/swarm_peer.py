"""One digits peer for the swarm tests: ``python -m tests.programs.swarm_peer --status s.json ...``.

It imports everything, then waits for ``--wait-file`` (if given): its content is the initial peers,
put in the ``INITIAL_PEERS`` environment variable (``--peers-via env``) or passed to the strategy
(``--peers-via arg``). So tests start every interpreter at once and decide later when each peer
joins. It trains ``DigitsModule`` with ``HivemindStrategy`` on 127.0.0.1, at most one local step
per ``--step-delay`` seconds, until the file ``--stop`` exists (or ``--max-seconds`` pass), and
records what the tests check in ``--status`` (JSON, rewritten atomically): the swarm it saw, its
epochs, losses, learning rates, and, in ``--snapshots``, its flattened parameters before joining
(``init.pt``), right after joining (``joined.pt``) and right after each swarm epoch (``<epoch>.pt``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from tests.support.waiting import wait_for_file
from worker.examples.digits import DigitsDataModule, DigitsModule
from worker.examples.local_swarm import local_trainer
from worker.strategy import HivemindStrategy

STOPPED_MARKER = "swarm_peer: training stopped, tearing down"


class ScheduledDigits(DigitsModule):
    """Digits with a step schedule, so a late peer's learning rate can be compared with the swarm's."""

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(self.parameters(), lr=self.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.8)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


def flat_params(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().cpu().clone() for p in module.parameters()])


class Recorder(Callback):
    """Writes the status file and parameter snapshots; stops training when the stop file appears."""

    def __init__(self, status: Path, snapshots: Path, stop: Path, step_delay_s: float) -> None:
        self.status_path, self.snapshots, self.stop = status, snapshots, stop
        self.step_delay_s = step_delay_s
        self.last_step_at = 0.0
        self.status: dict[str, Any] = {"pid": os.getpid(), "phase": "starting", "epochs": [], "lr": {}}
        self.last_epoch = -1

    def write(self) -> None:
        tmp = self.status_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.status))
        tmp.replace(self.status_path)

    def on_train_start(self, trainer: Trainer, module: LightningModule) -> None:
        torch.save(flat_params(module), self.snapshots / "init.pt")  # callbacks run before the strategy joins

    def on_train_batch_start(self, trainer: Trainer, module: LightningModule, batch: Any, idx: int) -> None:
        strategy: HivemindStrategy = trainer.strategy  # type: ignore[assignment]
        if self.status["phase"] == "starting":  # the strategy has joined (downloaded state) by now
            self._count_downloads(strategy)
            epoch = strategy.optimizer.local_epoch
            torch.save(flat_params(module), self.snapshots / "joined.pt")
            self.status.update(phase="training", joined_epoch=epoch, maddrs=strategy.visible_maddrs())
            self.status["joined_lr"] = trainer.optimizers[0].param_groups[0]["lr"]
            self.last_epoch = epoch
            self.write()
        if self.stop.exists():
            trainer.should_stop = True
        pause = self.last_step_at + self.step_delay_s - time.monotonic()
        if pause > 0:  # pace the peer like a model with real work per step
            time.sleep(pause)
        self.last_step_at = time.monotonic()

    def _count_downloads(self, strategy: HivemindStrategy) -> None:
        """Record each epoch this peer reached by downloading a peer's state instead of averaging.

        A peer that falls behind (a failed round, a slow step) catches up by a download, which may see
        the serving peer between its optimizer step and its state averaging: its parameters at that
        epoch then differ a little from the others' though nothing is wrong.
        """
        optimizer = strategy.optimizer
        download = optimizer.load_state_from_peers
        jumps: list[list[int]] = self.status.setdefault("download_jumps", [])

        def counted(*args: Any, **kwargs: Any) -> Any:
            before = optimizer.local_epoch
            result = download(*args, **kwargs)
            jumps.append([before, optimizer.local_epoch])  # from, to: the epochs it skipped
            return result

        optimizer.load_state_from_peers = counted

    def on_train_batch_end(
        self, trainer: Trainer, module: LightningModule, out: Any, batch: Any, idx: int
    ) -> None:
        strategy: HivemindStrategy = trainer.strategy  # type: ignore[assignment]
        loss = float(out["loss"])
        self.status.setdefault("first_loss", loss)
        self.status["last_loss"] = loss
        epoch = strategy.optimizer.local_epoch
        if epoch != self.last_epoch:
            self.last_epoch = epoch
            torch.save(flat_params(module), self.snapshots / f"{epoch}.pt")
            progress = strategy.swarm_progress()
            self.status["epochs"].append(
                {
                    "epoch": epoch,
                    "num_peers": progress.num_peers,
                    "swarm_epoch": progress.epoch,
                    "samples_per_second": progress.samples_per_second,
                    "local_samples": strategy.local_samples,
                    "time": time.time(),
                }
            )
            self.status["lr"][str(epoch)] = trainer.optimizers[0].param_groups[0]["lr"]
            self.status["metrics"] = {k: float(v) for k, v in trainer.callback_metrics.items()}
            outcomes = strategy.averaging_outcomes()
            self.status["averaging"] = outcomes.model_dump() if outcomes else None
            self.status["epochs_caught_up"] = strategy.optimizer.epochs_caught_up
            self.write()

    def on_train_end(self, trainer: Trainer, module: LightningModule) -> None:
        print(STOPPED_MARKER, flush=True)
        self.status["phase"] = "done"
        self.write()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--status", type=Path, required=True)
    parser.add_argument("--snapshots", type=Path, required=True)
    parser.add_argument("--stop", type=Path, required=True)
    parser.add_argument("--run-id", default="swarm_test")
    parser.add_argument("--wait-file", type=Path, default=None, help="wait for it; it holds initial peers")
    parser.add_argument("--peers-via", choices=("env", "arg"), default="env")
    parser.add_argument("--step-delay", type=float, default=0.05)
    parser.add_argument("--target-batch-size", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seconds", type=float, default=150.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sync", default="gradients", help="HivemindStrategy's sync mode")
    parser.add_argument("--average-state-every", type=int, default=None, help="default: the strategy's")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    args.snapshots.mkdir(parents=True, exist_ok=True)
    initial_peers = None
    if args.wait_file is not None:
        peers = wait_for_file(args.wait_file, args.max_seconds).read_text().strip()
        if args.peers_via == "env":
            os.environ["INITIAL_PEERS"] = peers
        else:
            initial_peers = peers
    trainer = local_trainer(
        args.run_id,
        args.target_batch_size,
        initial_peers,
        args.max_seconds,
        [Recorder(args.status, args.snapshots, args.stop, args.step_delay)],
        sync=args.sync,
        **({} if args.average_state_every is None else {"average_state_every": args.average_state_every}),
    )
    trainer.fit(ScheduledDigits(hidden=32, lr=0.03), DigitsDataModule(batch_size=args.batch_size))


if __name__ == "__main__":
    main()
