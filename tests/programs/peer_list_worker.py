"""A worker started by hand with a saved peer list, no orchestrator: plain Lightning and HivemindStrategy.

    python -m tests.programs.peer_list_worker PEERS_JSON SWARM_ID TARGET_BATCH_SIZE PROGRESS_JSON WORKER_JSON

``PEERS_JSON`` is a ``peers.json`` an agent keeps in its worker dir (``{"initial_peers": [...]}``).
``WORKER_JSON`` names the worker its user registered earlier with the run's join token (``url``,
``worker_id``, ``worker_token``, ``worker_dir``), whose swarm token was fetched then and cached in
``worker_dir`` with its identity (``worker/swarm_token_cache.py``): the swarm admits the peer on that
token, and it asks the orchestrator for a new one once it is back. Trains the digits example in the
swarm ``SWARM_ID`` until killed and rewrites ``PROGRESS_JSON`` with ``{"epoch": ..., "num_peers": ...}``
as this peer sees the swarm, about once a second. Started before its peer list exists, it imports
first and then waits for ``PEERS_JSON`` (written atomically) for up to ``PEERS_WAIT_S``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, Trainer

from tests.support.waiting import wait_for_file
from worker.admission.authorizer import SwarmAuthorizer
from worker.agent.client import OrchestratorClient
from worker.agent.token_cache import CachingTokenSource, ClientTokenSource, identity_path, load_token
from worker.examples.digits import DigitsDataModule, DigitsModule
from worker.protocol.trainer import NO_VALIDATION, QUIET
from worker.runtime.logsetup import configure_logging
from worker.strategy import HivemindStrategy

PEERS_WAIT_S = 300.0


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


def cached_authorizer(worker_json: str, swarm_id: str) -> SwarmAuthorizer:
    """The authorizer of the registered worker, on the token cached while the orchestrator was up."""
    worker = json.loads(Path(worker_json).read_text())
    worker_dir, worker_id = Path(worker["worker_dir"]), worker["worker_id"]
    cached = load_token(worker_dir, worker_id, swarm_id)
    assert cached is not None, "no unexpired swarm token cached for this worker"

    def client() -> OrchestratorClient:
        return OrchestratorClient(worker["url"], worker["worker_token"], timeout_s=10.0, retries=0)

    source = CachingTokenSource(ClientTokenSource(client, worker_id), worker_dir, worker_id)
    return SwarmAuthorizer(swarm_id, source, cached, identity_path(worker_dir, worker_id))


def main(
    peers_json: str, swarm_id: str, target_batch_size: str, progress_json: str, worker_json: str
) -> None:
    configure_logging("INFO")
    peers = json.loads(wait_for_file(Path(peers_json), PEERS_WAIT_S).read_text())["initial_peers"]
    strategy = HivemindStrategy(
        authorizer=cached_authorizer(worker_json, swarm_id),
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
    main(*sys.argv[1:6])
