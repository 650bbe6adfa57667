"""Helpers of the CLI and status-page tests: run `spotswarm` commands, and workers "started by hand".

:func:`cli` runs a command in-process (click's CliRunner) against a real orchestrator URL, with a
config file path that does not exist, so the developer's own ``~/.config/spotswarm`` never leaks in.
:class:`HandWorker` joins a run through the real API with the run's join token and reports progress
like an agent would (register, heartbeats, checkpoint upload, deregister), without training anything;
:class:`Beater` sends their heartbeats from a thread.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping
from pathlib import Path

from click.testing import CliRunner, Result

from orchestrator.cli import main
from tests.support.orchestrator import Orchestrator
from tests.support.waiting import wait_until
from worker.agent.client import OrchestratorClient
from worker.protocol.workers import (
    AveragingCounts,
    DeregisterReason,
    Heartbeat,
    HeartbeatReply,
    WorkerRegister,
)

SCRUBBED_ENV = (
    "SPOTSWARM_URL",
    "SPOTSWARM_TOKEN",
    "SPOTSWARM_CA_CERT",
    "SPOTSWARM_CONFIG",
    "XDG_CONFIG_HOME",
)


def cli(
    orch: Orchestrator | None,
    *args: str,
    token: str | None = None,
    url: str | None = None,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
) -> Result:
    """Run ``spotswarm ARGS`` in-process; URL and token go in as SPOTSWARM_URL / SPOTSWARM_TOKEN.

    ``token`` defaults to the admin token; pass ``token=""`` for none.
    """
    full_env: dict[str, str | None] = dict.fromkeys(SCRUBBED_ENV)
    full_env["SPOTSWARM_CONFIG"] = os.devnull + ".absent.toml"
    if orch is not None or url is not None:
        full_env["SPOTSWARM_URL"] = url or (orch.url if orch else None)
    chosen = orch.admin_token if token is None and orch is not None else token
    if chosen:
        full_env["SPOTSWARM_TOKEN"] = chosen
    full_env.update(env or {})
    return CliRunner().invoke(main, list(args), env=full_env, input=stdin, catch_exceptions=False)


class HandWorker:
    """A worker joined by hand: registers with the join token, then reports made-up progress."""

    def __init__(
        self,
        orch: Orchestrator,
        join_token: str,
        hostname: str = "by-hand",
        validates: bool = False,
        rounds: bool = False,
    ) -> None:
        self.validates = validates  # also report a falling val_loss and a rising val_acc
        #: also report averaging counts as a DiLoCo worker does: each epoch a round averaged, its samples kept
        self.rounds = rounds
        self.client = OrchestratorClient(orch.url, retries=1, backoff_s=0.1)
        body = WorkerRegister(hostname=hostname, launcher_handle="manual")
        registered = self.client.register(join_token, body)
        self.client.token = registered.worker_token
        self.worker_id = registered.worker_id
        self.step = 0

    def beat(self, samples_per_s: float = 50.0) -> HeartbeatReply:
        """One heartbeat with a falling loss (and validation metrics if it ``validates``)."""
        self.step += 1
        decay = math.exp(-self.step / 20)
        metrics = {"val_loss": 1.5 * decay + 0.2, "val_acc": 0.9 - 0.8 * decay} if self.validates else {}
        body = Heartbeat(
            local_step=self.step,
            swarm_epoch=self.step // 4,
            samples=self.step * 32,
            loss=2.0 * math.exp(-self.step / 20) + 0.1,
            samples_per_s=samples_per_s,
            num_peers=1,
            metrics=metrics,
            averaging=AveragingCounts(averaged=self.step // 4, kept_samples=self.step // 4 * 4 * 32)
            if self.rounds
            else None,
        )
        return self.client.heartbeat(self.worker_id, body)

    def upload(self, epoch: int, path: Path) -> None:
        """Upload as the run's checkpointer (only it may): heartbeats until the orchestrator names it."""
        wait_until(lambda: self.beat().checkpointer, 15, message=f"worker {self.worker_id} checkpoints")
        self.client.upload_checkpoint(self.worker_id, epoch, path)

    def leave(self, reason: DeregisterReason, message: str | None = None) -> None:
        self.client.deregister(self.worker_id, reason, message)
        self.client.close()


class Beater(threading.Thread):
    """Sends a heartbeat for each of ``workers`` every ``interval_s`` until stopped."""

    def __init__(self, workers: list[HandWorker], interval_s: float = 0.3) -> None:
        super().__init__(daemon=True)
        self.workers = list(workers)
        self.interval_s = interval_s
        self.halt = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        while not self.halt.wait(self.interval_s):
            with self.lock:
                for worker in self.workers:
                    worker.beat(40.0 + 10 * (worker.step % 7))

    def drop(self, worker: HandWorker) -> None:
        """Stop beating for ``worker`` (returns after any heartbeat in flight)."""
        with self.lock:
            self.workers.remove(worker)

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=10)
