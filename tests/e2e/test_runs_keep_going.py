"""A run is started once and the system keeps it training through churn, scaling, total loss and an
orchestrator crash: real `spotswarm serve`, real reconcile loop, real local worker processes and DHT."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from tests.support import api
from tests.support.orchestrator import Orchestrator
from tests.support.processes import ProcessRegistry
from tests.support.runs import ROUNDS, RunReader, admin_post, digits_run, kill_worker, start_loop_orchestrator
from tests.support.waiting import BOOT_S, wait_until

pytestmark = [pytest.mark.swarm]
CHANCE_LOSS = math.log(10)  # cross-entropy of a uniform guess over the 10 digits
TARGET_ROUNDS = 10  # of the run that completes: a late second worker has time to train on the swarm's model


def _losses(reader: RunReader) -> list[float]:
    """The run's loss over time (each point its workers' latest one-batch losses)."""
    with reader.orch.client() as http:
        points = http.get(f"/api/v1/runs/{reader.name}/progress?max_points=500").json()["points"]
    losses = [float(p["loss"]) for p in points if p["loss"] is not None]
    assert len(losses) >= 8, f"the run's loss was reported {len(losses)} times: {losses}"
    return losses


@pytest.mark.timeout(300)
def test_run_of_two_workers_completes_with_falling_loss(loop_orch: Orchestrator) -> None:
    orch = loop_orch
    # 10 rounds of 3 s (the default mode): long enough for the second worker to join and train
    rounds = {**ROUNDS, "sync_every_s": 3.0}
    spec = digits_run("done", stop={"target_epochs": TARGET_ROUNDS}, strategy_options=rounds)
    admin_post(orch, api.runs(), spec)
    reader = RunReader(orch, "done")
    final = wait_until(
        lambda: (run := reader.run())["state"] in ("completed", "failed", "stopped") and run,
        BOOT_S + 120,
        message="the run reaches its stop condition",
    )
    assert final["state"] == "completed", final["state_reason"]
    assert final["reported"]["swarm_epoch"] >= TARGET_ROUNDS
    workers = reader.workers()
    assert len([w for w in workers if w["registered_at"]]) >= 2, "two workers trained"
    assert all(w["state"] == "exited" for w in workers), [(w["id"], w["state"]) for w in workers]
    # a worker that joined as the run ended may report only its first step's loss: judge those that trained,
    # against chance level for 10 classes (ln 10 = 2.30; the first sampled loss may come a few steps in).
    # Each last loss is one batch of 32 after some 30 s of training: all below chance, the best at half.
    losses = [w["loss"] for w in workers if w["loss"] is not None and w["samples"] > 0]
    assert losses and max(losses) < CHANCE_LOSS and min(losses) < 0.5 * CHANCE_LOSS, losses
    # The run's loss falls: one batch's loss is heavy-tailed once the model fits the training set (one
    # confident miss in 32 costs about 0.5), so the series is judged by its medians: the second half's
    # below the first four points'.
    series = _losses(reader)
    early, late = statistics.median(series[:4]), statistics.median(series[len(series) // 2 :])
    assert late < early, (early, late, series)
    assert max(c["epoch"] for c in reader.checkpoints()) >= TARGET_ROUNDS, "the final checkpoint is kept"
    # the workers trained one model: some rounds averaged, groups of both, no warning (the
    # run is shorter than the judged window, so the warning could only come from a bug)
    counts = [w["averaging"] for w in workers if w["averaging"]]
    assert sum(c["averaged"] for c in counts) >= 1, counts
    assert all(c["group_size_sum"] >= 2 * c["averaged"] for c in counts), counts
    assert final["averaging"] is not None and final["averaging"]["warning"] is None, final["averaging"]


@pytest.mark.timeout(600)
def test_run_survives_churn_and_scaling(loop_orch: Orchestrator) -> None:
    orch = loop_orch
    admin_post(orch, api.runs(), digits_run("churn"))
    reader = RunReader(orch, "churn")
    wait_until(lambda: len(reader.running()) == 2 and reader.epoch() >= 2, BOOT_S, message="2 workers train")

    victim = reader.running()[0]
    kill_worker(victim)
    wait_until(
        lambda: next(w for w in reader.workers() if w["id"] == victim["id"])["state"] == "lost",
        60,
        message="the killed worker is marked lost",
    )
    epoch_at_kill = reader.epoch()
    wait_until(
        lambda: len([w for w in reader.running() if w["id"] != victim["id"] and w["samples"] > 0]) == 2,
        BOOT_S,
        message="a replacement registered and contributes",
    )
    assert reader.epoch() >= epoch_at_kill

    admin_post(orch, api.run_scale("churn"), {"desired_workers": 3})
    wait_until(lambda: len(reader.running()) == 3, BOOT_S, message="scaled up to 3 running workers")
    admin_post(orch, api.run_scale("churn"), {"desired_workers": 2})
    wait_until(
        lambda: any(w["state"] == "exited" for w in reader.workers()) and len(reader.running()) == 2,
        90,
        message="one worker retired by the scale-down",
    )

    admin_post(orch, api.run_stop("churn"))
    wait_until(lambda: reader.run()["state"] == "stopped", 90, message="the run stops")
    kinds = " ".join(f"{e['kind']} {e['message']}" for e in reader.events())
    assert "-> lost" in kinds and "run.scaled" in kinds and "worker.retire" in kinds
    assert all(w["state"] not in ("launching", "running") for w in reader.workers())


@pytest.mark.timeout(600)
def test_orchestrator_crash_and_total_loss_keep_the_swarm_epoch(
    processes: ProcessRegistry, loop_data_dir: Path
) -> None:
    orch = start_loop_orchestrator(processes, loop_data_dir)
    admin_post(orch, api.runs(), digits_run("crash"))
    reader = RunReader(orch, "crash")
    wait_until(lambda: len(reader.running()) == 2 and reader.checkpoints(), BOOT_S, message="a checkpoint")
    epoch_at_crash = reader.epoch()

    orch.kill()  # kill -9: the workers keep training without it
    orch = start_loop_orchestrator(
        processes, loop_data_dir, port=orch.port, dht_port=orch.dht_port, name="orchestrator-2"
    )
    reader = RunReader(orch, "crash")
    wait_until(
        lambda: reader.epoch() > epoch_at_crash and len(reader.running()) == 2,
        90,
        message="workers re-attach and the swarm moved on",
    )
    assert len(reader.workers()) == 2, "no worker was launched twice after the restart"

    checkpoint_epoch = max(c["epoch"] for c in reader.checkpoints())
    originals = {w["id"] for w in reader.workers()}
    for worker in reader.running():
        kill_worker(worker)
    wait_until(
        lambda: len([w for w in reader.running() if w["id"] not in originals and w["samples"] > 0]) == 2,
        BOOT_S,
        message="two replacements train",
    )
    replacements = [w for w in reader.running() if w["id"] not in originals]
    assert all(w["swarm_epoch"] >= checkpoint_epoch for w in replacements), (checkpoint_epoch, replacements)

    admin_post(orch, api.run_stop("crash"))
    wait_until(lambda: reader.run()["state"] == "stopped", 90, message="the run stops")


@pytest.mark.timeout(300)
def test_worker_that_cannot_import_the_module_fails_the_run_with_the_reason(
    processes: ProcessRegistry, loop_data_dir: Path
) -> None:
    orch = start_loop_orchestrator(processes, loop_data_dir, extra_env={"SPOTSWARM_MAX_START_FAILURES": "2"})
    spec = digits_run(
        "broken",
        module="tests.e2e.worker_only_broken:DigitsModule",
        datamodule="tests.e2e.worker_only_broken:DigitsDataModule",
        desired_workers=1,
    )
    admin_post(orch, api.runs(), spec)
    reader = RunReader(orch, "broken")
    run = wait_until(lambda: (r := reader.run())["state"] == "failed" and r, BOOT_S, message="run failed")
    messages = " ".join(e["message"] for e in reader.events())
    assert "a_dependency_missing_on_workers" in messages, messages[-2000:]
    # exit 3 (an unusable spec) fails the run at its first worker, with the worker's words
    assert "cannot use the run's spec" in run["state_reason"], run["state_reason"]
    assert len(reader.workers()) == 1, reader.workers()
