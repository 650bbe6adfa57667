"""bench/time_to_accuracy.py in its quick mode (1 and 2 real peers on 127.0.0.1, one trial): the script
runs to the end, every configuration reaches its target, and it prints the table with its machine,
load and commit, so it cannot rot between benchmark runs."""

from __future__ import annotations

import sys

import pytest

from tests.support.processes import REPO_ROOT, ProcessRegistry

pytestmark = pytest.mark.swarm


@pytest.mark.timeout(300)
def test_time_to_accuracy_quick_mode_prints_its_table(processes: ProcessRegistry) -> None:
    bench = processes.start("tta", [sys.executable, str(REPO_ROOT / "bench/time_to_accuracy.py"), "--quick"])
    out = bench.wait_for_exit(270, "the benchmark")  # its trials give up after 100 s each
    assert bench.popen.returncode == 0, out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0].startswith("| peers |") and [r.split("|")[1].strip() for r in rows[1:]] == ["1", "2"], out
    assert "not reached" not in out and "machine:" in out and "load average" in out and "commit" in out
