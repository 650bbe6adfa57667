"""bench/swarm_start.py with one round: every arm trains two real peers to the target and the table
prints, with its machine, load and commit, so the script cannot rot between benchmark runs."""

from __future__ import annotations

import sys

import pytest

from tests.support.processes import REPO_ROOT, ProcessRegistry

pytestmark = pytest.mark.swarm


@pytest.mark.timeout(260)
def test_swarm_start_bench_prints_every_arm(processes: ProcessRegistry) -> None:
    bench = processes.start(
        "start", [sys.executable, str(REPO_ROOT / "bench/swarm_start.py"), "--rounds", "1"]
    )
    out = bench.wait_for_exit(240, "the benchmark")  # each trial gives up after 60 s
    assert bench.popen.returncode == 0, out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r.split("|")[1].strip() for r in rows] == [
        "arm",
        "hivemind",
        "strategy",
        "strategy, chunk timeout 1/3",
    ], out
    assert all(r.split("|")[2].strip() == "1/1" for r in rows[1:]), out
    assert "machine:" in out and "load average" in out and "commit" in out
