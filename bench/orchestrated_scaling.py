"""Does N beat 1 through the orchestrator? Runs created with ``spotswarm runs create --workdir`` as a user
would, one worker against two, each worker pinned to cores of its own, timed to a validation loss.

One real orchestrator (``spotswarm serve`` on a free port, a temporary data dir, the reconcile loop and
the local launcher). The user's project (``bench/byte_project.py``: the byte-level transformer of
``bench/scaling.py`` as a LightningModule and DataModule, validating every ``--val-every-batches``
batches) is written into a temporary directory and shipped with each run by the CLI, from a spec file.
Arms, interleaved over ``--trials`` (a machine that gets busier meanwhile hurts both alike):

- arm 1: 1 worker, ``sync=diloco``, ``cpus_per_worker`` = cores / 2;
- arm 2: 2 workers, ``sync=diloco``, each pinned to cores / 2 of its own.

Each run trains for ``--budget-s`` from its first reported sample, then is stopped with ``spotswarm runs
stop`` and waited on until its workers have left. The run's progress series (``GET
/api/v1/runs/NAME/progress``: the mean of its workers' latest ``val_loss``) gives the validation loss
over time; the target is the best loss every arm-1 trial reaches (or ``--target-loss``), and each arm's
time is its first point at or below it. Prints T1, T2 and T1/T2 (medians over trials), the time from
``runs create`` to the first sample, the samples per second of all workers, the share of worker time
spent waiting on averaging and of rounds averaged with a peer, with the machine, load average and commit.

``.venv/bin/python bench/orchestrated_scaling.py [--trials 3] [--budget-s 150] [--quick]``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.byte_project import DATAMODULE, MODULE, write_project
from bench.bytelm import add_model_arguments
from bench.time_to_accuracy import commit, machine
from tests.support.orchestrator import Orchestrator
from tests.support.processes import VENV_BIN, ProcessRegistry
from tests.support.runs import RunReader, kill_local_workers, start_loop_orchestrator
from tests.support.waiting import wait_until
from worker.protocol.sync import DEFAULT_OUTER_LR, DEFAULT_OUTER_MOMENTUM
from worker.protocol.workers import AVERAGING_OUTCOMES

ARMS = {1: "1 worker, DiLoCo", 2: "2 workers, DiLoCo"}
ENDED_RUN_STATES = ("stopped", "completed", "failed")
LIVE_WORKER_STATES = ("launching", "running")

Curve = list[tuple[float, float]]  # (seconds since the run's first sample, val_loss)


def spotswarm(orch: Orchestrator, *args: str, timeout_s: float = 600) -> str:
    """Run the ``spotswarm`` CLI as a user would (its own process; URL and token from the environment,
    no config file); its output. Raises with the output when it fails."""
    env = {**os.environ, "SPOTSWARM_URL": orch.url, "SPOTSWARM_TOKEN": orch.admin_token}
    env["SPOTSWARM_CONFIG"] = os.devnull + ".absent.toml"
    done = subprocess.run(
        [str(VENV_BIN / "spotswarm"), *args], capture_output=True, text=True, env=env, timeout=timeout_s
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"spotswarm {' '.join(args)} failed ({done.returncode}): {done.stdout}{done.stderr}"
        )
    return done.stdout


def spec(name: str, workers: int, cpus: int, args: argparse.Namespace) -> dict[str, Any]:
    """The run's spec file: DiLoCo rounds every ``--sync-every-s``, each worker on ``cpus`` cores."""
    model_args = {"width": args.width, "layers": args.layers, "heads": args.heads, "lr": args.lr}
    return {
        "name": name,
        "module": MODULE,
        "module_args": {**model_args, "context": args.context},
        "datamodule": DATAMODULE,
        "datamodule_args": {
            "context": args.context,
            "val_windows": args.val_windows,
            "train_bytes": args.train_bytes,
            "val_bytes": args.val_bytes,
        },
        "batch_size": args.batch_size,
        "target_batch_size": 256,  # not read in DiLoCo mode: rounds come by time
        "desired_workers": workers,
        "min_workers": 0,
        "max_workers": workers,
        "strategy_options": {
            "sync": "diloco",
            "sync_every_s": args.sync_every_s,
            "outer_lr": args.outer_lr,
            "outer_momentum": args.outer_momentum,
        },
        "launcher_options": {"cpus_per_worker": cpus},
        "trainer": {"val_check_interval": args.val_every_batches, "check_val_every_n_epoch": None},
        "checkpoint_every_epochs": 100_000,  # no uploads during the measured time
    }


def seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def curve_of(points: list[dict[str, Any]]) -> Curve:
    """val_loss over time since the run's first sample."""
    trained = [p for p in points if p["samples_total"] > 0]
    if not trained:
        return []
    start = seconds(trained[0]["at"])
    return [
        (seconds(p["at"]) - start, p["metrics"]["val_loss"]) for p in trained if "val_loss" in p["metrics"]
    ]


def samples_per_s(points: list[dict[str, Any]]) -> float | None:
    """Samples per second of all the run's workers together, from its first sample to its last point."""
    trained = [p for p in points if p["samples_total"] > 0]
    if len(trained) < 2:
        return None
    span_s = seconds(trained[-1]["at"]) - seconds(trained[0]["at"])
    return (trained[-1]["samples_total"] - trained[0]["samples_total"]) / span_s if span_s > 0 else None


def averaging_of(points: list[dict[str, Any]]) -> dict[str, float | None]:
    """From the last point's counts, summed over the run's workers: the share of their time spent waiting
    on averaging, and the share of their rounds averaged with a peer (not alone, failed or timed out)."""
    last = (points[-1].get("averaging") if points else None) or {}
    busy = float(last.get("train_s", 0.0)) + float(last.get("averaging_s", 0.0))
    rounds = sum(int(last.get(key, 0)) for key in AVERAGING_OUTCOMES)
    return {
        "waiting": float(last.get("averaging_s", 0.0)) / busy if busy else None,
        "averaged": int(last.get("averaged", 0)) / rounds if rounds else None,
    }


def run_arm(
    orch: Orchestrator, project: Path, name: str, workers: int, args: argparse.Namespace
) -> dict[str, Any]:
    """Create the run with the CLI, let it train ``--budget-s`` from its first sample, stop it and wait
    until its workers have left; its curve and figures."""
    spec_path = project.parent / f"{name}.json"
    spec_path.write_text(json.dumps(spec(name, workers, args.cpus_per_worker, args)))
    created_at = time.time()
    spotswarm(orch, "runs", "create", "-f", str(spec_path), "--workdir", str(project))
    reader = RunReader(orch, name)
    wait_until(
        lambda: [w for w in reader.workers() if (w.get("samples") or 0) > 0],
        args.start_timeout_s,
        interval_s=0.5,
        message=f"a worker of {name} trains",
    )
    started_s = time.time() - created_at
    time.sleep(args.budget_s)
    points = reader.get("/progress?max_points=10000")["points"]
    stop(orch, reader)  # on an error instead, measure() kills the server and every worker at once
    epoch = max((p["swarm_epoch"] for p in points), default=0)
    figures = {"start_s": started_s, "rounds": epoch, "samples_per_s": samples_per_s(points)}
    return {"curve": curve_of(points), **figures, **averaging_of(points)}


def stop(orch: Orchestrator, reader: RunReader) -> None:
    """``spotswarm runs stop``, then wait until no worker of the run is live (their cores are free)."""
    if reader.run()["state"] not in ENDED_RUN_STATES:
        spotswarm(orch, "runs", "stop", reader.name, "--reason", "benchmark arm done")
    wait_until(
        lambda: not [w for w in reader.workers() if w["state"] in LIVE_WORKER_STATES],
        120,
        interval_s=0.5,
        message=f"the workers of {reader.name} leave",
    )


def time_to(curve: Curve, target: float) -> float | None:
    return next((t for t, loss in curve if loss <= target), None)


def median_or_none(values: list[float | None]) -> float | None:
    """The median, or None when any trial did not get there (a median of those that did would flatter)."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known and len(known) == len(values) else None


def median_share(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{statistics.median(known):.1%}" if known else "-"


def summary(results: dict[int, list[dict[str, Any]]], target_loss: float | None) -> list[str]:
    """The table: per arm time to target, T1/T, start-up time, waiting share, best loss."""
    single_bests = [min((loss for _, loss in r["curve"]), default=None) for r in results[1]]
    known_bests = [b for b in single_bests if b is not None]
    if target_loss is None and len(known_bests) != len(single_bests):
        return ["a 1-worker run reported no val_loss: no target"]
    target = target_loss if target_loss is not None else max(known_bests)
    times = {
        arm: median_or_none([time_to(r["curve"], target) for r in runs]) for arm, runs in results.items()
    }
    t1 = times.get(1)
    lines = [
        f"target validation loss {target:.4f} nats/byte"
        + (" (given)" if target_loss is not None else " (the best loss every 1-worker trial reaches)"),
        (
            "| arm | workers | time to target | T1/T | start-up | samples/s | waiting on averaging "
            "| rounds | averaged with a peer | best loss |"
        ),
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for arm, runs in results.items():
        t = times[arm]
        shown = f"{t:.1f} s" if t is not None else "not reached"
        speed = f"{t1 / t:.2f}" if t and t1 else "-"
        start = statistics.median(r["start_s"] for r in runs)
        rounds = statistics.median(r["rounds"] for r in runs)
        best = min((loss for r in runs for _, loss in r["curve"]), default=float("nan"))
        rates = [r["samples_per_s"] for r in runs if r["samples_per_s"] is not None]
        rate = f"{statistics.median(rates):.0f}" if rates else "-"
        cells = [f"{arm}: {ARMS[arm]}", str(arm), shown, speed, f"{start:.1f} s", rate]
        cells += [median_share([r["waiting"] for r in runs]), f"{rounds:g}"]
        cells.append(median_share([r["averaged"] for r in runs]))
        lines.append(f"| {' | '.join(cells)} | {best:.4f} |")
    t2 = times.get(2)
    shown_t1 = f"{t1:.1f} s" if t1 is not None else "not reached"
    shown_t2 = f"{t2:.1f} s" if t2 is not None else "not reached"
    ratio = f"{t1 / t2:.2f}" if t1 and t2 else "-"
    lines.append(f"T1 {shown_t1}, T2 {shown_t2}, T1/T2 {ratio}")
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=150.0, help="training time of each run")
    parser.add_argument("--target-loss", type=float, default=None)
    parser.add_argument("--cpus-per-worker", type=int, default=None, help="default: cores // 2")
    parser.add_argument("--sync-every-s", type=float, default=5.0, help="DiLoCo round length")
    parser.add_argument("--outer-lr", type=float, default=DEFAULT_OUTER_LR)
    parser.add_argument("--outer-momentum", type=float, default=DEFAULT_OUTER_MOMENTUM)
    parser.add_argument("--val-every-batches", type=int, default=60, help="about 5 s on a core")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    add_model_arguments(parser)
    parser.add_argument("--start-timeout-s", type=float, default=300.0)
    parser.add_argument("--curves", type=Path, default=None, help="write every run's curve here (JSON)")
    parser.add_argument("--quick", action="store_true", help="a small run that checks the script works")
    return parser


def measure(args: argparse.Namespace, tmp: Path) -> dict[int, list[dict[str, Any]]]:
    """Start the orchestrator, write the project, run the arms interleaved; stop everything it started."""
    data_dir = tmp / "orch"
    processes = ProcessRegistry(tmp)
    project = write_project(tmp / "user" / "bytelm-project")
    results: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    env = {"SPOTSWARM_CACHE_DIR": str(tmp / "worker-cache")}
    try:
        orch = start_loop_orchestrator(processes, data_dir, extra_env=env)
        for trial in range(args.trials):
            for arm in ARMS:
                result = run_arm(orch, project, f"bytelm-{arm}w-t{trial + 1}", arm, args)
                best = min((loss for _, loss in result["curve"]), default=float("nan"))
                print(
                    f"trial {trial + 1}/{args.trials}, arm {arm}: {len(result['curve'])} points, "
                    f"best val_loss {best:.4f}",
                    flush=True,
                )
                results[arm].append(result)
    finally:
        processes.kill_all()
        kill_local_workers(data_dir)
    return results


def main() -> int:
    args = build_parser().parse_args()
    # a SIGTERM (a test's time-out) still stops the orchestrator and the workers: they run in sessions of
    # their own, so killing this process's group would leave them behind
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.quick:
        args.trials, args.budget_s, args.sync_every_s, args.val_every_batches = 1, 6.0, 2.0, 10
        args.width, args.layers, args.batch_size, args.val_windows = 32, 1, 16, 16
    cores = len(os.sched_getaffinity(0))
    args.cpus_per_worker = args.cpus_per_worker or max(1, cores // 2)
    if 2 * args.cpus_per_worker > cores:
        print(f"2 workers x {args.cpus_per_worker} cores do not fit on {cores} cores")
        return 2
    load_before, at_commit = os.getloadavg()[0], commit()
    with tempfile.TemporaryDirectory(prefix="spotswarm-orchscaling-") as tmp:
        results = measure(args, Path(tmp))
    print(
        f"\nmachine: {machine()}; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; "
        f"commit {at_commit}"
    )
    print(
        f"settings: runs created with spotswarm runs create --workdir, sync=diloco, rounds every "
        f"{args.sync_every_s:g} s, outer lr {args.outer_lr} and momentum {args.outer_momentum}; "
        f"{args.cpus_per_worker} core(s) per worker; budget {args.budget_s:g} s per run, {args.trials} "
        f"trial(s), medians; model width {args.width}, {args.layers} layer(s), context {args.context}, "
        f"batch {args.batch_size}, AdamW lr {args.lr}; validation every {args.val_every_batches} batches "
        f"on {args.val_windows} windows"
    )
    if args.curves is not None:
        args.curves.write_text(json.dumps({arm: [r["curve"] for r in runs] for arm, runs in results.items()}))
    print("\n".join(summary(results, args.target_loss)))
    return 0 if all(r["curve"] for runs in results.values() for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
