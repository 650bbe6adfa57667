"""bench/diloco_steps.py in its quick mode (a tiny model, 40 steps): the script runs to the end and prints
its table with the machine, load and commit, and one row per arm, so it cannot rot between benchmark
runs. It measures nothing at this size."""

from __future__ import annotations

import sys

import pytest

from tests.support.processes import REPO_ROOT, ProcessRegistry


@pytest.mark.timeout(120)
def test_diloco_steps_quick_mode_prints_a_row_per_arm(processes: ProcessRegistry) -> None:
    args = [sys.executable, str(REPO_ROOT / "bench/diloco_steps.py"), "--quick"]
    bench = processes.start("diloco-steps", args)
    out = bench.wait_for_exit(100, "the benchmark")
    assert bench.popen.returncode == 0, out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0].startswith("| arm |"), out
    names = [row.split("|")[1].strip() for row in rows[1:]]
    assert names == ["single", "synchronous (2 x batch)", "diloco1 H=10", "diloco H=10"], out
    assert "machine:" in out and "load average" in out and "commit" in out and "target:" in out
