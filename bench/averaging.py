"""How many epochs orchestrated workers train on averaged gradients, with swarm admission on and off, and
how many samples they put into each swarm epoch.

One real orchestrator (`spotswarm serve`, reconcile loop, local launcher); for each trial a run of the
digits example with ``--workers`` workers, admission on and off alternating trial by trial (a machine that
gets busier meanwhile hurts both alike). Each run trains for ``--seconds`` once all workers contribute;
the workers' averaging outcome counts and samples (what the API shows) are read before and after, and the
run is stopped. Prints, per configuration, the worker-epochs by outcome, the averaged fraction and the
samples per swarm epoch against ``target_batch_size``, with the machine's load and the commit.

``.venv/bin/python bench/averaging.py [--trials 2] [--seconds 60] [--target-batch-size 256] [--workers 2]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.processes import ProcessRegistry
from tests.support.runs import RunReader, admin_post, digits_run, kill_local_workers, start_loop_orchestrator
from tests.support.waiting import wait_until
from worker.protocol.workers import AVERAGING_OUTCOMES

CONFIGS = {"admission on": True, "admission off": False}


def one_run(orch: Any, name: str, admission: bool, args: argparse.Namespace) -> dict[str, int]:
    """Train a run of ``--workers`` workers for ``--seconds`` once all contribute; its workers' outcome
    counts, samples and swarm epochs over that time."""
    options: dict[str, Any] = {"matchmaking_time": args.matchmaking_time, "averaging_timeout": 10.0}
    if not admission:
        options["swarm_admission"] = False
    spec = digits_run(
        name,
        strategy_options=options,
        target_batch_size=args.target_batch_size,
        desired_workers=args.workers,
        max_workers=max(4, args.workers),
    )
    admin_post(orch, "/api/v1/runs", spec)
    reader = RunReader(orch, name)
    wait_until(
        lambda: len([w for w in reader.running() if w["samples"] > 0]) >= args.workers,
        300,
        message=f"{args.workers} workers train",
    )
    before = totals(reader)
    time.sleep(args.seconds)  # the measured training time
    after = totals(reader)
    admin_post(orch, f"/api/v1/runs/{name}/stop")
    wait_until(lambda: reader.run()["state"] in ("stopped", "completed", "failed"), 120, message="stopped")
    return {key: after[key] - before[key] for key in after}


def totals(reader: RunReader) -> dict[str, int]:
    """Outcome counts and samples summed over the run's workers, and the run's swarm epoch."""
    counts = dict.fromkeys((*AVERAGING_OUTCOMES, "samples"), 0)
    for worker in reader.workers():
        for key in AVERAGING_OUTCOMES:
            counts[key] += int((worker.get("averaging") or {}).get(key, 0))
        counts["samples"] += int(worker.get("samples") or 0)
    counts["swarm_epochs"] = reader.epoch()
    return counts


def commit() -> str:
    command = ["git", "rev-parse", "--short", "HEAD"]
    out = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).parent, check=False)
    return out.stdout.strip() or "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trials", type=int, default=2, help="runs per configuration (they alternate)")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured training time per run")
    parser.add_argument("--target-batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2, help="workers per run")
    parser.add_argument("--matchmaking-time", type=float, default=1.0)
    args = parser.parse_args()
    results = {label: dict.fromkeys((*AVERAGING_OUTCOMES, "samples", "swarm_epochs"), 0) for label in CONFIGS}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="spotswarm-bench-") as tmp:
        data_dir = Path(tmp) / "orch"
        processes = ProcessRegistry(Path(tmp))
        try:
            orch = start_loop_orchestrator(processes, data_dir)
            for index in range(args.trials):
                for label, admission in CONFIGS.items():
                    counts = one_run(orch, f"avg-{index}-{'on' if admission else 'off'}", admission, args)
                    epochs = sum(counts[key] for key in AVERAGING_OUTCOMES)
                    line = f"trial {index + 1}, {label}: {counts['averaged']} of {epochs} averaged"
                    print(line, flush=True)
                    for key in counts:
                        results[label][key] += counts[key]
        finally:
            processes.kill_all()
            kill_local_workers(data_dir)
    print(
        f"\nmachine: {os.cpu_count()} cores; load average {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after; commit {commit()}"
    )
    print(
        f"settings: digits, {args.workers} workers, target_batch_size {args.target_batch_size}, batch 32, "
        f"matchmaking {args.matchmaking_time} s, averaging timeout 10 s, {args.trials} run(s) of "
        f"{args.seconds:g} s each"
    )
    print(
        "| configuration | worker-epochs | averaged | alone | no_group | timeout | failed | downloaded "
        "| swarm epochs | samples per swarm epoch / target |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label, counts in results.items():
        epochs = sum(counts[key] for key in AVERAGING_OUTCOMES)
        share = f"{counts['averaged']} ({counts['averaged'] / epochs:.0%})" if epochs else "0"
        rest = " | ".join(str(counts[k]) for k in AVERAGING_OUTCOMES[1:])
        swarm = counts["swarm_epochs"]
        ratio = f"{counts['samples'] / (swarm * args.target_batch_size):.2f}" if swarm else "-"
        print(f"| {label} | {epochs} | {share} | {rest} | {swarm} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
