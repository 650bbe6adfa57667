"""How fast a run recovers a worker, next to how long a fresh worker takes to start contributing.

In one run, against a real orchestrator (`spotswarm serve`, reconcile loop, local launcher) training the
digits example with 2 workers, it measures:

- fresh start: from a worker's launch to its first contributed sample (the run's first 2 workers);
- recovery after ``kill -9``: from the kill to the replacement's first contributed sample;
- recovery after a freeze (SIGSTOP: the process is there but silent, so only the heartbeat timeout
  reveals it): from the freeze to the replacement's first contributed sample.

It prints each time and the ratios to a fresh start. Target: recovery <= heartbeat timeout + one fresh
start. Usage: ``.venv/bin/python bench/recovery.py [--heartbeat-timeout-s 10] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.processes import ProcessRegistry
from tests.support.runs import RunReader, admin_post, digits_run, kill_local_workers, start_loop_orchestrator
from tests.support.waiting import wait_until

POLL_S = 0.2


def first_contribution(
    reader: RunReader, exclude: set[str], timeout_s: float
) -> tuple[dict[str, Any], float]:
    """Wait for a worker not in ``exclude`` to report samples; return it and the monotonic time seen."""

    def contributing() -> dict[str, Any] | None:
        return next((w for w in reader.workers() if w["id"] not in exclude and w["samples"] > 0), None)

    worker = wait_until(contributing, timeout_s, interval_s=POLL_S, message="a worker contributes")
    return worker, time.monotonic()


def fresh_start_s(reader: RunReader, timeout_s: float) -> list[float]:
    """Launch-to-first-sample of the run's first workers (launch time from the worker rows)."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout_s
    while len(seen) < 2 and time.monotonic() < deadline:
        for worker in reader.workers():
            if worker["samples"] > 0 and worker["id"] not in seen:
                launched = datetime.fromisoformat(worker["created_at"]).timestamp()
                seen[worker["id"]] = time.time() - launched
        time.sleep(POLL_S)
    if len(seen) < 2:
        raise TimeoutError("the first two workers did not contribute in time")
    return list(seen.values())


def recover(reader: RunReader, how: str, timeout_s: float) -> float:
    """Hurt one contributing worker (``kill`` or ``freeze``) and time its replacement's first sample."""
    victim = next(w for w in reader.running() if w["samples"] > 0)
    known = {w["id"] for w in reader.workers()}
    started = time.monotonic()
    os.killpg(int(victim["launcher_handle"]), signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    _, seen = first_contribution(reader, known, timeout_s)
    if how == "freeze":
        # the orchestrator may have terminated it already (a lost worker that stays silent)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(victim["launcher_handle"]), signal.SIGKILL)
    print(f"  {how}: replacement contributed after {seen - started:.1f} s", flush=True)
    return seen - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--heartbeat-timeout-s", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2, help="kills and freezes each")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="spotswarm-bench-") as tmp:
        data_dir = Path(tmp) / "orch"
        processes = ProcessRegistry(Path(tmp))
        try:
            env = {"SPOTSWARM_HEARTBEAT_TIMEOUT_S": str(args.heartbeat_timeout_s)}
            orch = start_loop_orchestrator(processes, data_dir, extra_env=env)
            admin_post(orch, "/api/v1/runs", digits_run("bench"))
            reader = RunReader(orch, "bench")
            fresh = fresh_start_s(reader, 300)
            kills = [recover(reader, "kill", 300) for _ in range(args.rounds)]
            freezes = [recover(reader, "freeze", 300) for _ in range(args.rounds)]
        finally:
            processes.kill_all()
            kill_local_workers(data_dir)
    report(fresh, kills, freezes, args.heartbeat_timeout_s)


def report(fresh: list[float], kills: list[float], freezes: list[float], timeout_s: float) -> None:
    fresh_s = statistics.median(fresh)
    bound_s = timeout_s + fresh_s
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"fresh worker, launch -> first sample:     {fresh_s:6.1f} s  (each: {_fmt(fresh)})")
    for name, values in (("kill -9", kills), ("freeze (SIGSTOP)", freezes)):
        median = statistics.median(values)
        print(
            f"recovery after {name:<17} -> first sample: {median:6.1f} s  (each: {_fmt(values)})"
            f"  ratio to fresh start {median / fresh_s:4.2f}"
        )
    worst = max(kills + freezes)
    verdict = "met" if worst <= bound_s else "MISSED"
    print(
        f"target: recovery <= heartbeat timeout {timeout_s:.0f} s + fresh start = {bound_s:.1f} s: {verdict}"
    )


def _fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values)


if __name__ == "__main__":
    main()
