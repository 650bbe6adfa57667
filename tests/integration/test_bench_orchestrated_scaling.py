"""bench/orchestrated_scaling.py in its quick mode (a tiny model, 6 s a run): a real orchestrator, the
user's project shipped with `spotswarm runs create --workdir`, one DiLoCo run of 1 worker and one of 2
pinned workers. The script runs to the end, reads a validation loss of both runs from the API, prints
its table with T1, T2 and the two workers' rounds averaged together, the machine, load and commit, and
leaves nothing running (also when stopped by SIGTERM: that test is not in the swarm lane, it holds however
slowly the peers run), so it cannot rot between benchmark runs. It measures nothing at this size."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.bench_scripts import nothing_left, scratch_dir, sigterm_once_a_worker_runs, start_script
from tests.support.processes import ManagedProcess, ProcessRegistry


@pytest.fixture
def scratch() -> Iterator[Path]:
    with scratch_dir("orchscale-") as path:
        yield path


def start_quick(processes: ProcessRegistry, scratch: Path) -> ManagedProcess:
    return start_script(processes, "orchestrated-scaling", "orchestrated_scaling.py", ["--quick"], scratch)


@pytest.mark.swarm
@pytest.mark.timeout(300)
def test_orchestrated_scaling_quick_mode_prints_t1_and_t2_and_leaves_nothing_running(
    processes: ProcessRegistry, scratch: Path
) -> None:
    bench = start_quick(processes, scratch)
    try:
        out = bench.wait_for_exit(250, "the benchmark")
    finally:
        bench.terminate(timeout_s=30)  # SIGTERM first: the script then stops its server and workers

    assert bench.popen.returncode == 0, out
    assert "trial 1/1, arm 1:" in out and "trial 1/1, arm 2:" in out, out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0].startswith("| arm |"), out
    assert [row.split("|")[1].strip()[:2] for row in rows[1:]] == ["1:", "2:"], out
    assert rows[1].split("|")[3].strip().endswith(" s"), out  # the 1-worker run reaches its own best
    assert rows[2].split("|")[9].strip() not in ("-", "0.0%"), out  # the two workers averaged together
    assert "target validation loss" in out and "T1 " in out and "T2 " in out and "T1/T2" in out, out
    assert "machine:" in out and "load average" in out and "commit" in out, out
    assert "spotswarm runs create --workdir" in out and "sync=diloco" in out, out
    nothing_left(scratch)


@pytest.mark.timeout(300)
def test_orchestrated_scaling_stopped_by_sigterm_mid_run_leaves_nothing_running(
    processes: ProcessRegistry, scratch: Path
) -> None:
    bench = start_quick(processes, scratch)
    exit_code = sigterm_once_a_worker_runs(bench, scratch)

    assert exit_code == 143, bench.log()[-3000:]  # its own exit, not the SIGKILL after the grace time
    nothing_left(scratch)
