"""A worker started by hand with a saved peer list, no orchestrator: plain Lightning and HivemindStrategy.

    python -m tests.e2e.peer_list_worker PEERS_JSON SWARM_ID TARGET_BATCH_SIZE PROGRESS_JSON

``PEERS_JSON`` is a ``peers.json`` an agent keeps in its worker dir (``{"initial_peers": [...]}``).
Trains the digits example in the swarm ``SWARM_ID`` until killed and rewrites ``PROGRESS_JSON`` with
``{"epoch": ..., "num_peers": ...}`` as this peer sees the swarm, about once a second.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, Trainer

from worker.examples.digits import DigitsDataModule, DigitsModule
from worker.logsetup import configure_logging
from worker.strategy import HivemindStrategy
from worker.trainer_options import NO_VALIDATION, QUIET


class WriteProgress(Callback):
    def __init__(self, path: Path) -> None:
        self.path = path
        self.last = 0.0

    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        if time.monotonic() - self.last < 1.0:
            return
        self.last = time.monotonic()
        progress = trainer.strategy.swarm_progress()  # type: ignore[attr-defined]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"epoch": progress.epoch, "num_peers": progress.num_peers}))
        os.replace(tmp, self.path)


def main(peers_json: str, swarm_id: str, target_batch_size: str, progress_json: str) -> None:
    configure_logging("INFO")
    peers = json.loads(Path(peers_json).read_text())["initial_peers"]
    strategy = HivemindStrategy(
        target_batch_size=int(target_batch_size),
        run_id=swarm_id,
        batch_size=32,
        initial_peers=peers,
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        matchmaking_time=1.0,
        averaging_timeout=10.0,
    )
    trainer = Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=1,
        max_epochs=-1,
        callbacks=[WriteProgress(Path(progress_json))],
        **QUIET,
        **NO_VALIDATION,
    )
    trainer.fit(DigitsModule(hidden=32, lr=0.05), datamodule=DigitsDataModule(batch_size=32))


if __name__ == "__main__":
    main(*sys.argv[1:5])
