"""How long a local worker takes from its launch to its first contributed sample, preloaded or not.

Two real orchestrators (`spotswarm serve`, reconcile loop, local launcher) run side by side, one with
``--local-preload`` (the default: workers forked from a process that imported Lightning, torch and
hivemind once) and one with ``--no-local-preload`` (each worker a fresh interpreter). Round by round,
alternating, each starts a run of the digits example with 2 workers, times each worker from its launch
to its first contributed sample, and stops the run. A preloaded orchestrator's first launch waits for its
fork server to import, so its first round is printed apart from the median of the others.

``.venv/bin/python bench/worker_start.py [--rounds 4]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.recovery import fresh_start_s
from tests.support.processes import ProcessRegistry
from tests.support.runs import RunReader, admin_post, digits_run, kill_local_workers, start_loop_orchestrator
from tests.support.waiting import wait_until

ARMS = {"preloaded": "true", "fresh interpreter": "false"}


def one_round(orch, name: str) -> list[float]:  # type: ignore[no-untyped-def]
    """Start a run of 2 workers, time both to their first sample, stop it and wait for its workers."""
    admin_post(orch, "/api/v1/runs", digits_run(name, desired_workers=2))
    reader = RunReader(orch, name)
    times = fresh_start_s(reader, 300)
    reader.admin_post("/stop")
    wait_until(lambda: reader.run()["state"] == "stopped", 120, interval_s=0.5, message=f"{name} stopped")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=4, help="runs per arm (the first is reported apart)")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    print(f"commit {commit.strip()}, load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    times: dict[str, list[list[float]]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory(prefix="spotswarm-bench-") as tmp:
        processes = ProcessRegistry(Path(tmp))
        data_dirs = {arm: Path(tmp) / f"orch-{i}" for i, arm in enumerate(ARMS)}
        try:
            orchs = {
                arm: start_loop_orchestrator(
                    processes, data_dirs[arm], extra_env={"SPOTSWARM_LOCAL_PRELOAD": flag}, name=f"orch-{i}"
                )
                for i, (arm, flag) in enumerate(ARMS.items())
            }
            for round_index in range(args.rounds):
                for arm, orch in orchs.items():
                    each = one_round(orch, f"bench-{round_index}")
                    times[arm].append(each)
                    print(f"  round {round_index} {arm}: {', '.join(f'{t:.1f}' for t in each)} s", flush=True)
        finally:
            processes.kill_all()
            for data_dir in data_dirs.values():
                kill_local_workers(data_dir)
    report(times)


def report(times: dict[str, list[list[float]]]) -> None:
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    medians = {}
    for arm, rounds in times.items():
        later = [t for each in rounds[1:] for t in each]
        medians[arm] = statistics.median(later) if later else float("nan")
        first = ", ".join(f"{t:.1f}" for t in rounds[0])
        print(f"{arm:>18}: first run {first} s; later runs, median of {len(later)}: {medians[arm]:.1f} s")
    preloaded, fresh = medians["preloaded"], medians["fresh interpreter"]
    print(f"launch -> first sample, preloaded / fresh interpreter: {preloaded / fresh:.2f}")


if __name__ == "__main__":
    main()
