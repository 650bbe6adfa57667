"""Replacement at the notice: a worker the simulated spot market reclaims keeps training through its
notice period, and the reconcile loop launches its replacement at the notice (as far as the market has
capacity), so the replacement trains before the reclaimed worker is gone. In DiLoCo rounds, the noticed
worker leaves right after its last round before its leave, so that nothing it trains is lost (what it
trained after that round would never be averaged in).

The market (``local_spot_market``) follows a trace the test writes: one slot, then none (the worker on
it gets a notice of 90 s, in real time), then one again a few seconds later (capacity elsewhere).
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support import api
from tests.support.processes import ProcessRegistry
from tests.support.runs import ROUNDS, RunReader, admin_post, digits_run, start_loop_orchestrator
from tests.support.spot_market import spot_market
from tests.support.waiting import BOOT_S, wait_until

pytestmark = [pytest.mark.swarm]

#: in real time, shorter than EC2's 120 s to save test time: the worker trains on for 45 s of it (the
#: agent leaves 45 s before the end), within which the replacement's start-up has to fit
NOTICE_S = 90.0
#: rounds far enough apart that training on to the leave would lose thousands of samples
SYNC_EVERY_S = 15.0
#: samples a leaving worker may count outside its rounds: the batch it stops in, give or take one
LOST_SAMPLES_BOUND = 2 * 32


@pytest.mark.timeout(600)
def test_the_replacement_of_a_noticed_worker_trains_before_the_noticed_worker_is_gone(
    processes: ProcessRegistry, loop_data_dir: Path, tmp_path: Path
) -> None:
    trace, env = spot_market(tmp_path, '[0, "add", {"nodes": ["a"]}]\n', slots=1, notice_s=NOTICE_S, seed=3)
    orch = start_loop_orchestrator(processes, loop_data_dir, extra_env=env)
    created_at = time.time()  # the trace starts at the first launch, a moment later
    admin_post(
        orch,
        api.runs(),
        digits_run(
            "prelaunch",
            desired_workers=1,
            stop={"target_epochs": 100_000},
            strategy_options={**ROUNDS, "sync_every_s": SYNC_EVERY_S},
        ),
    )
    reader = RunReader(orch, "prelaunch")

    def training() -> list[dict[str, Any]]:
        return [w for w in reader.running() if w["samples"] > 0]

    [first] = wait_until(training, BOOT_S, interval_s=1, message="the worker on the one slot trains")

    # The slot is reclaimed (a notice for the only worker), and another is free 5 trace seconds later.
    back_at_ms = int(((time.time() - created_at) + 5) * 1000)
    with trace.open("a") as out:
        out.write(f'[0, "remove", {{"nodes": ["a"]}}]\n[{back_at_ms}, "add", {{"nodes": ["b"]}}]\n')
    noticed_at = time.time()

    def replaced_or_gone() -> tuple[float | None, dict[str, Any]] | None:
        """(when a replacement trained, or None if the noticed worker left first; its row), once either."""
        rows = reader.workers()
        first_row = next(w for w in rows if w["id"] == first["id"])
        others = [w for w in rows if w["id"] != first["id"] and w["registered_at"] and w["samples"] > 0]
        if others:
            return time.time(), first_row
        return (None, first_row) if first_row["state"] != "running" else None

    replacement_trained_at, first_row = wait_until(
        replaced_or_gone,
        NOTICE_S + 30,
        interval_s=0.5,
        message="a replacement trains or the noticed worker leaves",
    )
    assert replacement_trained_at is not None, (
        f"no replacement trained while the noticed worker ran (it is {first_row['state']}: "
        f"{first_row['exit_reason']}, {time.time() - noticed_at:.0f} s after the notice)"
    )
    assert first_row["state"] == "running", "the noticed worker was still there"
    assert replacement_trained_at - noticed_at < NOTICE_S

    def left() -> dict[str, Any]:
        row = next(w for w in reader.workers() if w["id"] == first["id"])
        return row if row["state"] != "running" else {}

    gone = wait_until(left, NOTICE_S + 30, message="the noticed worker leaves by the end of its notice")
    assert gone["state"] == "interrupted", gone
    ended_at = datetime.fromisoformat(gone["ended_at"]).timestamp()
    assert ended_at - noticed_at <= NOTICE_S, "it left before the market took the machine back"
    lost = gone["samples"] - (gone["averaging"] or {}).get("kept_samples", 0)
    assert 0 <= lost <= LOST_SAMPLES_BOUND, f"it left {lost} samples out of its rounds: {gone}"
    print(  # the figures (pytest -s)
        f"notice -> replacement trains {replacement_trained_at - noticed_at:.1f} s; "
        f"notice -> noticed worker gone {ended_at - noticed_at:.1f} s (notice {NOTICE_S:.0f} s); "
        f"samples outside its rounds {lost}"
    )
    assert reader.run()["state"] == "running"
