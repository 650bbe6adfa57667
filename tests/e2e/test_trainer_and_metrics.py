"""A run with a trainer section and reported metrics, end to end: `spotswarm serve` with the reconcile
loop and the local launcher, one digits worker (it logs ``val_loss``), created with the CLI from the
spec file and the command of docs/guides/trainer-and-metrics.md. The worker applies the section (bf16,
clipping, validation every few batches on one batch, a stock LearningRateMonitor, a CSVLogger); the API,
the CLI and ``/metrics`` show ``val_loss`` and the learning rate for the run and the worker; the orchestrator
writes them as TensorBoard events; after `runs stop` the finished run still shows its last loss and
``val_loss``. The validation a worker runs as it stops, its last, reaches the run."""

from __future__ import annotations

import csv
import json
import shlex
import struct
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from tensorboardX.proto.event_pb2 import Event

from tests.support import api
from tests.support.cli import cli
from tests.support.orchestrator import Orchestrator
from tests.support.processes import REPO_ROOT, ProcessRegistry
from tests.support.runs import RunReader, admin_post, digits_run, start_loop_orchestrator
from tests.support.waiting import BOOT_S, wait_until

pytestmark = [pytest.mark.swarm]
DOC = REPO_ROOT / "docs/guides/trainer-and-metrics.md"
CREATE = (
    "spotswarm runs create -f run.yaml --trainer-option precision=bf16-mixed "
    "--report-metric train_loss --report-metric 'val_*' --report-metric 'lr-*'"
)
RUN = "digits-val"
#: LearningRateMonitor names the series by the class of the optimizer Lightning holds: in DiLoCo mode (the
#: run names no mode), the strategy's DiLoCo optimizer, whose learning rate is the module's own optimizer's
LR = "lr-DiLoCoOptimizer"


def run_file(tmp_path: Path) -> Path:
    """The documented run.yaml, with one worker, the test runs' swarm options and a temporary log dir."""
    text = DOC.read_text()
    spec = yaml.safe_load(text[text.index("```yaml\n") + 8 : text.index("```", text.index("```yaml\n") + 8)])
    assert spec["name"] == RUN and CREATE in text
    spec.update(desired_workers=1, min_workers=0, strategy_options=digits_run(RUN)["strategy_options"])
    spec["trainer"]["loggers"][0]["args"]["save_dir"] = str(tmp_path / "csv")
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def metric_series(orch: Orchestrator) -> dict[str, float]:
    """``spotswarm_run_metric`` of the run, by metric name."""
    with orch.client() as http:
        text = http.get("/metrics").text
    family = next(f for f in text_string_to_metric_families(text) if f.name == "spotswarm_run_metric")
    return {s.labels["name"]: s.value for s in family.samples if s.labels["run"] == RUN}


def tensorboard_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TFRecord event files under ``directory``: tag -> [(step, value)]."""
    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(directory.rglob("events.out.tfevents.*")):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack_from("<Q", data, offset)
            event = Event.FromString(data[offset + 12 : offset + 12 + length])  # after length and its CRC
            offset += 12 + length + 4  # the record and its CRC
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def reported(run: dict[str, Any]) -> dict[str, float]:
    return dict(run["reported"]["metrics"])


@pytest.mark.timeout(420)
def test_a_trainer_section_is_applied_and_its_metrics_are_shown_forwarded_and_kept(
    processes: ProcessRegistry, loop_data_dir: Path, tmp_path: Path
) -> None:
    env = {"SPOTSWARM_TENSORBOARD_DIR": str(tmp_path / "tb")}
    orch = start_loop_orchestrator(processes, loop_data_dir, extra_env=env)
    args = shlex.split(CREATE)[1:]
    args[args.index("run.yaml")] = str(run_file(tmp_path))
    # the first import check waits for the probe to import Lightning: seconds on a busy machine
    created = cli(orch, *args, "--timeout", "120")
    assert created.exit_code == 0, created.output
    reader = RunReader(orch, RUN)
    run = wait_until(
        lambda: {"val_loss", "val_acc", LR, "train_loss"} <= set(reported(r := reader.run())) and r,
        BOOT_S,
        message=lambda: f"the run reports val_loss and the learning rate: {reported(reader.run())}",
    )
    assert run["spec"]["trainer"]["precision"] == "bf16-mixed"
    assert reported(run)[LR] == pytest.approx(0.05)  # the digits run's Adam lr
    worker = reader.running()[0]
    assert {"val_loss", "val_acc", LR} <= set(worker["metrics"])
    assert metric_series(orch)["val_loss"] > 0

    # the charts come from the progress samples, written by the next heartbeat flush after the report
    show = wait_until(
        lambda: "\nval_loss (" in (r := cli(orch, "runs", "show", RUN)).stdout and r,
        30,
        message="runs show draws the validation chart beside the loss chart",
    )
    assert show.exit_code == 0, show.output
    assert "val_loss" in show.stdout and LR in show.stdout
    listed = cli(orch, "workers", "list", RUN)
    assert "val_acc=" in listed.stdout and f"{LR}=" in listed.stdout, listed.stdout  # cut after these

    with orch.admin() as http:  # the worker applied the section: bf16 autocast (Lightning says so)
        log = http.get(api.run_worker_log(RUN, worker["id"]), params={"tail_bytes": 1 << 20}).json()
    assert "Using bfloat16 Automatic Mixed Precision" in log["text"], log["text"][-3000:]
    rows = list(csv.DictReader((next((tmp_path / "csv").rglob("metrics.csv"))).open()))
    assert any(row.get("val_loss") for row in rows) and any(row.get(LR) for row in rows)

    # TensorBoard's steps are swarm epochs (here rounds, every 2 s): a couple of them before the stop
    wait_until(lambda: reader.run()["reported"]["swarm_epoch"] >= 2, 60, message="two swarm epochs")
    stopped = cli(orch, "runs", "stop", RUN)
    assert stopped.exit_code == 0, stopped.output
    finished = wait_until(lambda: (r := reader.run())["state"] == "stopped" and r, 90, message="it stops")
    assert finished["workers"]["live"] == 0
    assert finished["reported"]["loss"] is not None and "val_loss" in reported(finished)
    assert metric_series(orch)["val_loss"] == pytest.approx(reported(finished)["val_loss"])
    show = cli(orch, "runs", "show", "--json", RUN)
    shown = json.loads(show.stdout)["run"]["reported"]
    assert shown["loss"] == finished["reported"]["loss"] and shown["metrics"] == reported(finished)
    text = cli(orch, "runs", "show", RUN).stdout
    loss_line = next(line for line in text.splitlines() if line.strip().startswith("loss "))
    assert loss_line.split()[-1] != "-", text

    orch.stop()  # the forwarder writes its events out as the server stops
    scalars = tensorboard_scalars(tmp_path / "tb" / RUN)
    assert scalars["val_loss"] and scalars[LR] and scalars["spotswarm/loss"], sorted(scalars)
    steps = [step for step, _ in scalars["spotswarm/samples_total"]]
    assert steps == sorted(steps) and steps[-1] >= 1  # stepped by the swarm epoch


@pytest.mark.timeout(300)
def test_the_validation_a_worker_runs_as_the_run_completes_is_kept_by_the_run(
    loop_orch: Orchestrator,
) -> None:
    # validation only as a worker stops: a cadence the run never reaches (batches across passes)
    trainer = {"val_check_interval": 1_000_000, "check_val_every_n_epoch": None, "limit_val_batches": 2}
    spec = digits_run("last-val", desired_workers=1, trainer=trainer, stop={"target_epochs": 3})
    admin_post(loop_orch, api.runs(), spec)
    reader = RunReader(loop_orch, "last-val")
    run = wait_until(
        lambda: (r := reader.run())["state"] in ("completed", "stopped", "failed") and r,
        2 * BOOT_S,
        message="the run completes",
    )
    assert run["state"] == "completed", run["state_reason"]
    # the worker's last report carried the validation it ran as it stopped; nothing earlier had one
    assert {"val_loss", "val_acc"} <= set(reported(run)), reported(run)
    [worker] = reader.workers()
    assert "val_loss" in worker["metrics"], worker
