"""Two worker agents, started by hand, train the digits example in one swarm through a real orchestrator.

One life of a run, in one test to pay the start-up of torch, Lightning and hivemind only once: both
agents register and heartbeat, the swarm epoch rises, the checkpointer uploads checkpoints, the loss
falls; SIGTERM makes one agent leave as ``stopped``; stopping the run through the API makes the other
leave; after the run is resumed, a new agent starts from the checkpoint instead of epoch 0.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from tests.support import api
from tests.support.agent import start_hand_agent
from tests.support.orchestrator import NO_RECONCILE, Orchestrator, start_orchestrator
from tests.support.processes import ManagedProcess, ProcessRegistry
from tests.support.runs import RunReader, digits_run
from tests.support.waiting import BOOT_S, wait_until

pytestmark = [pytest.mark.swarm]
RUN = "agents"
# the default mode, rounds short enough for a test; the agents, started by hand, checkpoint the run
SPEC = digits_run(RUN, target_batch_size=64, batch_size=16)


def start_agent(processes: ProcessRegistry, tmp_path: Path, name: str, orch: Orchestrator, token: str) -> Any:
    return start_hand_agent(
        processes, name, orch.url, token, tmp_path / name, {"SPOTSWARM_STOP_GRACE_S": "20"}
    )


class Api(RunReader):
    def __init__(self, orch: Orchestrator) -> None:
        super().__init__(orch, RUN)

    def by_handle(self) -> dict[str, dict[str, Any]]:
        """Workers by hostname-independent key: the agent's process group id (its launcher handle)."""
        return {w["launcher_handle"]: w for w in self.get("/workers")["items"]}

    def worker_of(self, agent: ManagedProcess) -> dict[str, Any] | None:
        return self.by_handle().get(str(agent.pid))


def alive(*agents: ManagedProcess) -> None:
    """Fail at once (not at the deadline) when an agent has died."""
    for agent in agents:
        if not agent.alive():
            pytest.fail(f"agent exited with {agent.popen.returncode}:\n{agent.log()[-3000:]}")


def exit_code(agent: ManagedProcess, timeout_s: float) -> int:
    wait_until(lambda: not agent.alive(), timeout_s, message=lambda: f"agent exits\n{agent.log()[-3000:]}")
    return int(agent.popen.returncode)


@pytest.mark.timeout(420)
def test_agents_train_checkpoint_stop_and_resume(processes: ProcessRegistry, tmp_path: Path) -> None:
    # The import check is covered by the API tests; here it would only add its probe's start-up.
    env = {**NO_RECONCILE, "SPOTSWARM_CHECK_IMPORTS": "false"}
    orch = start_orchestrator(processes, tmp_path / "orch", extra_env=env)
    with orch.admin() as http:
        token = http.post(api.runs(), json=SPEC, timeout=120).raise_for_status().json()["join_token"]
    run_api = Api(orch)
    first, second = (start_agent(processes, tmp_path, n, orch, token) for n in ("first", "second"))

    def both_train() -> bool:
        alive(first, second)
        mine = [run_api.worker_of(first), run_api.worker_of(second)]
        return all(w and w["state"] == "running" and w["samples"] > 0 and w["loss"] for w in mine)

    wait_until(both_train, BOOT_S, interval_s=1, message="both agents register and report progress")
    start_loss = max(w["loss"] for w in run_api.by_handle().values())
    start_epoch = run_api.get("")["reported"]["swarm_epoch"]

    def trained() -> bool:
        alive(first, second)
        run = run_api.get("")
        return (
            bool(run_api.get("/checkpoints")["items"])
            and run["reported"]["swarm_epoch"] >= start_epoch + 4
            and (run["reported"]["loss"] or start_loss) < 0.6 * start_loss
        )

    wait_until(trained, 150, interval_s=1, message="epoch rises, loss falls, a checkpoint is uploaded")
    # a peer's count drops for a moment when the other's record expires while it waits out a round
    wait_until(
        lambda: all(w["num_peers"] >= 2 for w in run_api.by_handle().values()),
        60,
        interval_s=1,
        message="the agents trained together (each counts two peers)",
    )

    second.signal_group(signal.SIGTERM)
    assert exit_code(second, 60) == 0
    gone = run_api.worker_of(second)
    assert gone and gone["state"] == "exited" and gone["exit_reason"].startswith("stopped"), gone

    run_api.admin_post("/stop")
    assert exit_code(first, 60) == 0
    wait_until(lambda: run_api.get("")["state"] == "stopped", 30, message="the run stops")
    checkpoint_epoch = max(c["epoch"] for c in run_api.get("/checkpoints")["items"])

    run_api.admin_post("/resume")
    third = start_agent(processes, tmp_path, "third", orch, token)
    resumed = wait_until(
        lambda: alive(third) or ((w := run_api.worker_of(third)) and w["samples"] > 0 and w),
        BOOT_S,
        interval_s=1,
        message="a new agent trains after the resume",
    )
    assert resumed["swarm_epoch"] >= checkpoint_epoch, (resumed["swarm_epoch"], checkpoint_epoch)
    assert "resuming from the run's checkpoint" in third.log()
    third.signal_group(signal.SIGTERM)
    assert exit_code(third, 60) == 0
