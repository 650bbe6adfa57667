"""bench/spot_replay.py in its quick mode (a built-in five-minute trace on one slot, compressed 10x) in
its default mode, DiLoCo (new runs' default): the script drives a real orchestrator and local worker
through the trace to the end, counts the samples the worker's rounds kept, writes its plot and samples,
and prints its report with the last line it promises, so it cannot rot between benchmark runs. It
measures nothing at this size. Stopped by SIGTERM mid-replay, it stops the orchestrator and workers it
started (that test is not in the swarm lane: it holds however slowly the peers run)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.support.bench_scripts import nothing_left, scratch_dir, sigterm_once_a_worker_runs, start_script
from tests.support.processes import REPO_ROOT, ProcessRegistry


@pytest.mark.swarm
@pytest.mark.timeout(420)
def test_spot_replay_quick_mode_prints_goodput_and_writes_its_plot(
    processes: ProcessRegistry, tmp_path: Path
) -> None:
    out_dir = tmp_path / "out"
    args = [sys.executable, str(REPO_ROOT / "bench/spot_replay.py"), "--quick", "--out", str(out_dir)]
    bench = processes.start("spot-replay", args)
    out = bench.wait_for_exit(390, "the benchmark")
    assert bench.popen.returncode == 0, out
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(r"goodput \d+\.\d\d \(mode diloco, slots 1, compress 10\)", last), out
    assert "rounds every 3 s" in out, out  # the default 30 s, compressed as the trace is
    # the reclaimed worker's own count of samples its rounds did not keep
    assert re.search(
        r"lost work per preemption: \d+ samples \(mean; most \d+; each worker's own count\)", out
    )
    assert re.search(r"; \d+ core\(s\) per worker", out), out  # pinned: the machine's cores / slots
    assert re.search(r"steady progress \(samples/s, the ideal's rates\): 1 worker\(s\) \d+", out), out
    for line in (
        "capacity offered:",
        "preemptions:",
        "notice to replacement:",
        "zero-worker time:",
        "rollbacks:",
    ):
        assert line in out, out
    samples = json.loads((out_dir / "samples.json").read_text())
    assert {s["capacity"] for s in samples} == {0, 1}  # the trace's loss and return were sampled
    assert samples[-1]["progress"] > 0  # the workers' rounds kept samples (DiLoCo's kept_samples)
    assert (out_dir / "replay.svg").read_text().startswith("<svg")


@pytest.mark.timeout(300)
def test_spot_replay_stopped_by_sigterm_mid_replay_leaves_nothing_running(processes: ProcessRegistry) -> None:
    with scratch_dir("replay-") as scratch:
        bench = start_script(processes, "spot-replay", "spot_replay.py", ["--quick"], scratch)
        exit_code = sigterm_once_a_worker_runs(bench, scratch)

        assert exit_code == 143, bench.log()[-3000:]  # its own exit, not the SIGKILL after the grace time
        nothing_left(scratch)
