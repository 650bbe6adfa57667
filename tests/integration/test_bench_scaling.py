"""bench/scaling.py in its quick mode (a tiny model; one worker, N DiLoCo workers, N DDP workers and N DiLoCo
workers each behind a link capped at 10 Mbit/s in a network namespace of its own, each pinned to its own
core, 8 s an arm): the script runs to the end and prints its table with the machine, load and commit, so
it cannot rot between benchmark runs. It measures nothing at this size. The capped links need root and
iproute2, as the suite's other system parts need root (it installs Chromium and nginx when missing).

Not in the swarm lane: what it asserts holds however slowly its peers run (each arm trains for a fixed
time, and the table is printed whether or not an arm reaches a loss), so it runs beside the swarm tests
at the other lane's low priority instead of after them."""

from __future__ import annotations

import sys

import pytest

from tests.support.processes import REPO_ROOT, ProcessRegistry


@pytest.mark.timeout(300)
def test_scaling_quick_mode_prints_its_table(processes: ProcessRegistry) -> None:
    script = str(REPO_ROOT / "bench/scaling.py")
    args = [sys.executable, script, "--quick", "--arms", "AEFG", "--link-mbit", "10"]
    bench = processes.start("scaling", args)
    out = bench.wait_for_exit(270, "the benchmark")
    assert bench.popen.returncode == 0, out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0].startswith("| arm |"), out
    assert [row.split("|")[1].strip()[:1] for row in rows[1:]] == ["A", "E", "F", "G"], out
    assert "machine:" in out and "load average" in out and "commit" in out and "payload per round" in out
    assert "arms G capped at 10 Mbit/s" in out, out
