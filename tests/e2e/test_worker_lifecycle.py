"""A worker's life with user code: its own sampling order and its place among the run's workers, the
crash budget that ends a run whose code keeps failing, and the run that fails at its first worker that
cannot use its spec. Real `spotswarm serve`, reconcile loop and local
worker processes running the digits example (tests/e2e/lifecycle_models.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.support import api
from tests.support.orchestrator import Orchestrator
from tests.support.processes import ProcessRegistry
from tests.support.runs import GRADIENTS, RunReader, admin_post, digits_run, start_loop_orchestrator
from tests.support.waiting import BOOT_S, wait_until
from tests.support.workers import wait_ticks

pytestmark = [pytest.mark.swarm]
MODELS = "tests.e2e.lifecycle_models"


@pytest.mark.timeout(360)
def test_workers_of_a_module_seeded_by_the_user_draw_different_batches_and_know_their_slot(
    loop_orch: Orchestrator, tmp_path: Path
) -> None:
    orch = loop_orch
    records = tmp_path / "first-batches"
    records.mkdir()
    spec = digits_run(
        "seeded",
        module=f"{MODELS}:SeededDigitsModule",
        datamodule=f"{MODELS}:DigitsDataModule",
        module_args={"record_dir": str(records), "hidden": 32, "lr": 0.05},
    )
    admin_post(orch, api.runs(), spec)
    reader = RunReader(orch, "seeded")
    files = wait_until(
        lambda: len(found := sorted(records.glob("*.json"))) == 2 and found,
        BOOT_S,
        message="two first batches",
    )
    first, second = (json.loads(path.read_text()) for path in files)
    assert first["labels"] != second["labels"], "both workers drew the same first batch"
    assert first["features_sum"] != second["features_sum"]
    assert {first["worker_index"], second["worker_index"]} == {0, 1}
    assert {first["worker_id"], second["worker_id"]} == {str(w["id"]) for w in reader.workers()}
    assert all(1 <= r["num_workers"] <= 2 for r in (first, second))
    admin_post(orch, api.run_stop("seeded"))
    wait_until(lambda: reader.run()["state"] == "stopped", 90, message="the run stops")


@pytest.mark.timeout(420)
def test_a_run_whose_workers_keep_crashing_after_training_fails_with_the_error(
    processes: ProcessRegistry, loop_data_dir: Path
) -> None:
    # the server-wide default budget (the spec leaves max_worker_crashes out)
    orch = start_loop_orchestrator(processes, loop_data_dir, extra_env={"SPOTSWARM_MAX_WORKER_CRASHES": "2"})
    spec = digits_run(
        "crashing", module=f"{MODELS}:CrashingDigitsModule", datamodule=f"{MODELS}:DigitsDataModule"
    )
    spec["module_args"] = {"crash_after_batches": 5, "crash_after_s": 4.0, "hidden": 32}
    admin_post(orch, api.runs(), spec)
    reader = RunReader(orch, "crashing")
    started = time.monotonic()
    run = wait_until(
        lambda: (r := reader.run())["state"] in ("failed", "stopped", "completed") and r,
        2 * BOOT_S,
        message="the run fails",
    )
    elapsed_s = time.monotonic() - started
    assert run["state"] == "failed", run["state_reason"]
    assert "workers failed with the same error after training" in run["state_reason"], run["state_reason"]
    assert "the model diverged in a buggy layer" in run["state_reason"]
    failed = [w for w in reader.workers() if w["state"] == "failed"]
    # the budget's two crashed after training; a replacement may crash too before its first report
    assert len([w for w in failed if w["samples"] > 0]) >= 2, failed
    events = [e for e in reader.events() if e["kind"] == "worker.state" and "-> failed" in e["message"]]
    assert len(events) == len(failed) and all("the model diverged" in e["message"] for e in events), events
    launched = len(reader.workers())
    wait_ticks(orch, 6)
    assert len(reader.workers()) == launched, "workers were launched after the run failed"
    assert elapsed_s < 2 * BOOT_S


@pytest.mark.timeout(300)
def test_a_worker_that_cannot_use_the_spec_fails_the_run_at_once_with_its_error(
    loop_orch: Orchestrator,
) -> None:
    orch = loop_orch
    spec = digits_run(
        "unusable", module=f"{MODELS}:GpuOnlyDigitsModule", datamodule=f"{MODELS}:DigitsDataModule"
    )
    admin_post(orch, api.runs(), spec)  # the create-time check imports the module; it never builds it
    reader = RunReader(orch, "unusable")
    run = wait_until(
        lambda: (r := reader.run())["state"] in ("failed", "stopped", "completed") and r,
        2 * BOOT_S,
        message="the run fails",
    )
    assert run["state"] == "failed", run["state_reason"]
    assert run["state_reason"].startswith("worker "), run["state_reason"]
    assert (
        "cannot use the run's spec: cannot build tests.e2e.lifecycle_models:GpuOnlyDigitsModule: ValueError: "
        "this model needs a GPU, and this worker has none" in run["state_reason"]
    ), run["state_reason"]
    # the first launch's workers only: no replacement was started to fail alike
    launched = len(reader.workers())
    assert launched <= spec["desired_workers"], reader.workers()
    wait_ticks(orch, 4)
    assert len(reader.workers()) == launched, "workers were launched after the run failed"


@pytest.mark.timeout(300)
def test_a_run_with_a_sample_target_completes_at_the_first_epoch_past_it(loop_orch: Orchestrator) -> None:
    # 3 epochs of 128 samples are 384: one short of the target, so the run ends at epoch 4 (512 samples)
    orch = loop_orch
    admin_post(
        orch,
        api.runs(),
        digits_run(
            "by-samples", desired_workers=1, stop={"target_samples": 385}, strategy_options=dict(GRADIENTS)
        ),
    )
    reader = RunReader(orch, "by-samples")
    run = wait_until(
        lambda: (r := reader.run())["state"] in ("failed", "stopped", "completed") and r,
        2 * BOOT_S,
        message="the run ends",
    )
    assert run["state"] == "completed", run["state_reason"]
    assert run["reported"]["swarm_epoch"] >= 4, run["reported"]
    workers = wait_until(
        lambda: (ws := reader.workers()) and all(w["state"] == "exited" for w in ws) and ws,
        60,
        message="the worker leaves",
    )
    assert all(str(w["exit_reason"]).startswith("completed") for w in workers), workers
