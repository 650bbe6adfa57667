"""A stop keeps the work: the checkpointer uploads a final checkpoint of the epoch it stopped at.

One real agent (the digits example) trains alone in its swarm through a real orchestrator; the run's
checkpoint cadence is far longer than the test, so every checkpoint the run ends with is a final one.
``runs stop`` (the API call behind it) must leave a checkpoint within one epoch of the epoch the run
stopped at; a stop while the orchestrator is out of reach must still end with that checkpoint uploaded
once the orchestrator is back (the agent keeps it on disk and retries within its stop grace). The final
checkpoint, exported with ``spotswarm runs export``, loads in each documented way. The agent's log
carries none of its libraries' noise (Lightning's tip and its note at each checkpoint save, torch's
deprecation warning about Lightning).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import Trainer

from tests.support import api
from tests.support.agent import start_hand_agent
from tests.support.cli import cli
from tests.support.failover_proxy import FailoverProxy
from tests.support.orchestrator import NO_RECONCILE, Orchestrator, start_orchestrator
from tests.support.ports import free_port
from tests.support.processes import ManagedProcess, ProcessRegistry
from tests.support.runs import digits_run
from tests.support.waiting import BOOT_S, wait_until
from worker.agent.state import CHECKPOINTER_TAKEN
from worker.examples.digits import DigitsDataModule, DigitsModule

pytestmark = [pytest.mark.swarm]
STOP_GRACE_S = 90.0  # longer than the API outage below, with room for the upload after it
RUN = "keeps"
# no periodic checkpoint during the test: every checkpoint the run ends with is a final one
SPEC = digits_run(RUN, desired_workers=1, max_workers=2, checkpoint_every_epochs=1000)
ENV = {**NO_RECONCILE, "SPOTSWARM_CHECK_IMPORTS": "false"}


class Api:
    def __init__(self, orch: Orchestrator) -> None:
        self.orch = orch

    def get(self, path: str = "") -> Any:
        with self.orch.admin() as http:
            response = http.get(api.run(RUN) + path, timeout=15)
            response.raise_for_status()
            return response.json()

    def stop(self) -> None:
        with self.orch.admin() as http:
            http.post(api.run_stop(RUN), json={}, timeout=60).raise_for_status()

    def checkpoint_epochs(self) -> list[int]:
        return [c["epoch"] for c in self.get("/checkpoints")["items"]]


def start_run(
    processes: ProcessRegistry, tmp_path: Path, proxy: FailoverProxy | None = None
) -> tuple[Orchestrator, Api, ManagedProcess]:
    """The orchestrator, the run, and one agent (through ``proxy`` when given) that trains past swarm
    epoch 2 as the run's checkpointer."""
    orch = start_orchestrator(processes, tmp_path / "orch", extra_env=ENV)
    if proxy is not None:
        proxy.backends = [orch.port]
    with orch.admin() as http:
        token = http.post(api.runs(), json=SPEC, timeout=120).raise_for_status().json()["join_token"]
    url = proxy.url if proxy else orch.url
    agent = start_hand_agent(
        processes, "agent", url, token, tmp_path / "agent", {"SPOTSWARM_STOP_GRACE_S": str(STOP_GRACE_S)}
    )
    run_api = Api(orch)

    def checkpointer_past_epoch_2() -> bool:
        if not agent.alive():
            pytest.fail(f"agent exited with {agent.popen.returncode}:\n{agent.log()[-3000:]}")
        workers = run_api.get("/workers")["items"]
        elected = bool(workers) and workers[0]["checkpointer"] and workers[0]["swarm_epoch"] >= 2
        # the agent itself must know it (its next heartbeat reply tells it): the API shows the election
        # first, and an agent stopped in between rightly saves nothing
        return elected and CHECKPOINTER_TAKEN in agent.log()

    wait_until(checkpointer_past_epoch_2, BOOT_S + 120, interval_s=1, message="the agent trains")
    assert run_api.checkpoint_epochs() == [], "no periodic checkpoint at this cadence"
    return orch, run_api, agent


def exit_code(agent: ManagedProcess, timeout_s: float) -> int:
    wait_until(lambda: not agent.alive(), timeout_s, message=lambda: f"agent exits\n{agent.log()[-3000:]}")
    return int(agent.popen.returncode)


@pytest.mark.timeout(480)
def test_runs_stop_uploads_a_final_checkpoint_of_the_epoch_it_stopped_at(
    processes: ProcessRegistry, tmp_path: Path
) -> None:
    orch, run_api, agent = start_run(processes, tmp_path)
    stopped_at = run_api.get()["reported"]["swarm_epoch"]
    run_api.stop()
    assert exit_code(agent, STOP_GRACE_S + 30) == 0
    wait_until(lambda: run_api.get()["state"] == "stopped", 30, message="the run stops")
    final_epoch = run_api.get()["reported"]["swarm_epoch"]
    assert run_api.checkpoint_epochs(), f"no final checkpoint\n{agent.log()[-3000:]}"
    newest = max(run_api.checkpoint_epochs())
    assert stopped_at - 1 <= newest <= final_epoch, (stopped_at, newest, final_epoch)
    assert "saved checkpoint of epoch" in agent.log()
    assert_quiet_log(agent.log())
    assert_export_loads(orch, tmp_path / "model.ckpt", newest)


#: library lines a worker's log must not repeat (each has a cause fixed or a filter in
#: worker/runtime/logsetup.py)
NOISE = ("`weights_only` was not set", "Tip: For seamless cloud logging", "LeafSpec", "Traceback")


def assert_quiet_log(log: str) -> None:
    """No library noise, and every line in the log's own format (no library printing past it)."""
    assert not [noise for noise in NOISE if noise in log], log[-3000:]
    lines = [line for line in log.splitlines() if line.strip()]
    unformatted = [line for line in lines if not line[:4].isdigit() or " [run=" not in line[:60]]
    assert not unformatted, unformatted


def assert_export_loads(orch: Orchestrator, path: Path, epoch: int) -> None:
    """``spotswarm runs export`` writes a file that each way of loading the README shows takes (its
    snippet, with the digits example)."""
    exported = cli(orch, "runs", "export", RUN, "--epoch", str(epoch), "-o", str(path))
    assert exported.exit_code == 0, exported.output
    assert f"at swarm epoch {epoch}" in exported.output
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["spotswarm"]["run"] == RUN and checkpoint["spotswarm"]["swarm_epoch"] == epoch
    model = DigitsModule.load_from_checkpoint(path)
    assert dict(model.hparams) == {**SPEC["module_args"], "depth": 1}
    for key, value in model.state_dict().items():
        assert torch.equal(value, checkpoint["state_dict"][key]), key
    # a plain Trainer (plain Adam, no hivemind) resumes from it and trains one more epoch
    trainer = Trainer(
        max_epochs=checkpoint["epoch"] + 2,
        limit_train_batches=3,
        limit_val_batches=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        accelerator="cpu",
    )
    trainer.fit(
        DigitsModule(**SPEC["module_args"]), datamodule=DigitsDataModule(batch_size=16), ckpt_path=path
    )
    assert trainer.current_epoch == checkpoint["epoch"] + 2


@pytest.mark.timeout(540)
def test_a_stop_while_the_orchestrator_is_out_of_reach_uploads_the_final_checkpoint_once_it_is_back(
    processes: ProcessRegistry, tmp_path: Path
) -> None:
    """The agent reaches the orchestrator's API through a proxy, closed for a while (connections refused,
    as while the orchestrator restarts); the swarm's DHT peers stay up."""
    proxy: FailoverProxy | None = FailoverProxy(free_port(), [])
    port = proxy.port
    try:
        orch, run_api, agent = start_run(processes, tmp_path, proxy)
        stopped_at = run_api.get()["reported"]["swarm_epoch"]
        proxy.close()
        proxy = None
        # `kill PID` while the orchestrator is away (the agent's process only: its hivemind children
        # would die at once of a SIGTERM to the group, and a step waiting on them never returns)
        agent.popen.send_signal(signal.SIGTERM)
        # past the client's own retries (about 8 s): the upload waits for the orchestrator from now on
        wait_until(
            lambda: "retrying the upload" in agent.log() or not agent.alive(),
            60,
            message=lambda: f"the agent retries its final upload\n{agent.log()[-3000:]}",
        )
        proxy = FailoverProxy(port, [orch.port])
        assert exit_code(agent, STOP_GRACE_S + 30) == 0
    finally:
        if proxy is not None:
            proxy.close()
    epochs = run_api.checkpoint_epochs()
    assert epochs, f"no final checkpoint\n{agent.log()[-3000:]}"
    assert max(epochs) >= stopped_at - 1, (epochs, stopped_at)
    assert run_api.get("/workers")["items"][0]["state"] == "exited"
    assert not list((tmp_path / "agent" / "checkpoints").glob("*.ckpt")), "uploaded: nothing kept"
