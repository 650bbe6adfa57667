"""bench/spot_replay.py in its quick mode (a built-in five-minute trace on one slot, compressed 10x) in
its default mode, DiLoCo (new runs' default): the script drives a real orchestrator and local worker
through the trace to the end, counts the samples the worker's rounds kept, writes its plot and samples,
and prints its report with the last line it promises, so it cannot rot between benchmark runs. It
measures nothing at this size."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT, ProcessRegistry

pytestmark = pytest.mark.swarm


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
