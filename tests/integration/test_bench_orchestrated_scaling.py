"""bench/orchestrated_scaling.py in its quick mode (a tiny model, 10 s a run): a real orchestrator, the
user's project shipped with `spotswarm runs create --workdir`, one DiLoCo run of 1 worker and one of 2
pinned workers. The script runs to the end, reads a validation loss of both runs from the API, prints
its table with T1, T2 and the two workers' rounds averaged together, the machine, load and commit, and
leaves nothing running (also when stopped by SIGTERM), so it cannot rot between benchmark runs. It
measures nothing at this size."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT, ManagedProcess, ProcessRegistry
from tests.support.waiting import wait_until

pytestmark = pytest.mark.swarm


def processes_with_env(entry: str) -> list[int]:
    """PIDs of this user's processes whose environment holds ``entry`` (``NAME=value``)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if entry.encode() in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


@pytest.fixture
def scratch() -> Iterator[Path]:
    """The script's TMPDIR; afterwards, whatever still runs with it (when a test failed) is killed by PID:
    every process the script starts inherits it, the orchestrator's and the workers' sessions too. A short
    path: torch's shared-memory manager puts a Unix socket under it (at most 107 bytes), and pytest's
    per-test directories under a parallel run's worker are longer than that leaves room for."""
    path = Path(tempfile.mkdtemp(prefix="orchscale-"))
    yield path
    for pid in processes_with_env(f"TMPDIR={path}"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(path, ignore_errors=True)


def start_quick(processes: ProcessRegistry, scratch: Path) -> ManagedProcess:
    """``bench/orchestrated_scaling.py --quick`` with ``scratch`` as its TMPDIR (and its children's)."""
    args = [sys.executable, str(REPO_ROOT / "bench/orchestrated_scaling.py"), "--quick"]
    return processes.start("orchestrated-scaling", args, env={"TMPDIR": str(scratch)})


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
    wait_until(
        lambda: not processes_with_env(f"TMPDIR={scratch}"),
        30,
        message=lambda: f"the orchestrator and workers are gone: {processes_with_env(f'TMPDIR={scratch}')}",
    )


@pytest.mark.timeout(300)
def test_orchestrated_scaling_stopped_by_sigterm_mid_run_leaves_nothing_running(
    processes: ProcessRegistry, scratch: Path
) -> None:
    bench = start_quick(processes, scratch)

    def agents() -> list[int]:
        return [pid for pid in processes_with_env(f"TMPDIR={scratch}") if b"worker.agent" in cmdline(pid)]

    wait_until(agents, 200, interval_s=0.5, message=lambda: f"a worker agent runs: {bench.log()[-3000:]}")
    exit_code = bench.terminate(timeout_s=60)  # SIGTERM, as a test's time-out or Ctrl-C in a pipeline

    assert exit_code == 143, bench.log()[-3000:]  # its own exit, not the SIGKILL after the grace time
    wait_until(
        lambda: not processes_with_env(f"TMPDIR={scratch}"),
        30,
        message=lambda: f"the orchestrator and workers are gone: {processes_with_env(f'TMPDIR={scratch}')}",
    )


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
