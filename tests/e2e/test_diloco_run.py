"""A DiLoCo run through the orchestrator (``strategy_options: {"sync": "diloco"}``) on two local workers
pinned to a core each (``launcher_options: {"cpus_per_worker": 1}``): its rounds are the swarm epochs the
run's stop condition, checkpoints and view count, its workers average in rounds, and its checkpoint holds
the global weights and the outer optimizer's state. Real `spotswarm serve` with the reconcile loop."""

from __future__ import annotations

import io

import pytest
import torch

from tests.support.orchestrator import Orchestrator
from tests.support.runs import RunReader, admin_post, digits_run
from tests.support.waiting import BOOT_S, wait_until

pytestmark = [pytest.mark.swarm]
ROUNDS = 12


@pytest.mark.timeout(420)
def test_a_diloco_run_of_two_pinned_workers_completes_in_rounds(loop_orch: Orchestrator) -> None:
    options = {"matchmaking_time": 1.0, "averaging_timeout": 10.0, "sync": "diloco", "sync_every_s": 3.0}
    spec = digits_run(
        "diloco",
        strategy_options=options,
        launcher_options={"cpus_per_worker": 1},
        stop={"target_epochs": ROUNDS},
        checkpoint_every_epochs=4,
    )
    admin_post(loop_orch, "/api/v1/runs", spec)
    reader = RunReader(loop_orch, "diloco")
    final = wait_until(
        lambda: (run := reader.run())["state"] in ("completed", "failed", "stopped") and run,
        BOOT_S + 180,
        message=lambda: f"the run reaches {ROUNDS} rounds: {reader.run().get('reported')}",
    )
    assert final["state"] == "completed", final["state_reason"]
    assert final["reported"]["swarm_epoch"] >= ROUNDS
    workers = [w for w in reader.workers() if w["registered_at"]]
    assert len(workers) >= 2, "two workers trained"
    counts = [w["averaging"] for w in workers if w["averaging"]]
    assert sum(c["averaged"] for c in counts) >= 1, counts  # rounds together, not two models apart
    latest = max(reader.checkpoints(), key=lambda c: c["epoch"])
    assert latest["epoch"] >= ROUNDS - 4
    with loop_orch.admin() as http:
        response = http.get(latest["download_path"])
    assert response.status_code == 200, response.text
    checkpoint = torch.load(io.BytesIO(response.content), weights_only=True)
    state = checkpoint["optimizer_states"][0]
    assert state["state"]["local_epoch"] == latest["epoch"]
    assert {"stepped", "tensors"} <= set(state["diloco"]) and state["diloco"]["stepped"]
