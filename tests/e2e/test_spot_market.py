"""The simulated spot market end to end: a real `spotswarm serve` whose local launcher obeys a market
(``local_spot_market``), real workers training the digits example, and the trace written as the test goes
(the market follows it), so each event comes when the test is ready for it:

1. the market offers one slot and the run wants two: the second launch is refused as EC2's
   ``InsufficientInstanceCapacity``, the run's events say so, and the loop backs off between tries;
   (a second test: no capacity at all for longer than the start-up failures that fail a run, then some)
2. the market takes the slot back: the worker on it gets EC2's notice through its own metadata service,
   leaves as ``interrupted``, and its process is gone by the end of the (compressed) notice period;
3. the market gives two slots: the loop launches again and both workers train.
"""

from __future__ import annotations

import itertools
import os
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support import api
from tests.support.processes import ProcessRegistry
from tests.support.runs import RunReader, admin_post, digits_run, start_loop_orchestrator
from tests.support.spot_market import spot_market
from tests.support.waiting import BOOT_S, wait_until

BACKOFF_BASE_S = 2.0  # the loop ticks every 0.5 s: tries this far apart are its back-off, not its pace
COMPRESS = 12.0  # EC2's 120 s notice in 10 s


def group_gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def refused(workers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Workers whose launch the market refused, oldest first."""
    return sorted(
        (w for w in workers if "InsufficientInstanceCapacity" in w["state_reason"]),
        key=lambda w: w["created_at"],
    )


@pytest.mark.swarm
@pytest.mark.timeout(600)
def test_market_refuses_launches_reclaims_with_notice_and_gives_capacity_back(
    processes: ProcessRegistry, loop_data_dir: Path, tmp_path: Path
) -> None:
    one_of_two = '[0, "add", {"nodes": ["a", "b"]}]\n[0, "remove", {"nodes": ["b"]}]\n'
    trace, market_env = spot_market(tmp_path, one_of_two, slots=2, compress=COMPRESS, seed=5)
    env = {
        **market_env,
        "SPOTSWARM_LAUNCH_BACKOFF_BASE_S": str(BACKOFF_BASE_S),
        "SPOTSWARM_LAUNCH_BACKOFF_CAP_S": str(2 * BACKOFF_BASE_S),
    }
    orch = start_loop_orchestrator(processes, loop_data_dir, extra_env=env)
    admin_post(
        orch, api.runs(), digits_run("spot-market", desired_workers=2, stop={"target_epochs": 100_000})
    )
    reader = RunReader(orch, "spot-market")

    # 1. One slot: the second worker is refused for capacity, again and again, with the back-off between.
    def three_refused() -> list[dict[str, Any]]:
        rows = refused(reader.workers())
        return rows if len(rows) >= 3 else []

    refusals = wait_until(three_refused, 120, message="launches refused for capacity")
    assert all(w["state"] == "failed" for w in refusals)
    assert "no spot capacity" in refusals[0]["state_reason"]
    starts = [datetime.fromisoformat(w["created_at"]) for w in refusals]
    gaps_s = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(starts)]
    assert min(gaps_s) >= BACKOFF_BASE_S * 0.9, gaps_s
    assert any(
        "InsufficientInstanceCapacity" in e["message"]
        for e in reader.events()
        if e["kind"] == "run.no_capacity"
    )

    def training() -> list[dict[str, Any]]:
        return [w for w in reader.running() if w["swarm_epoch"] >= 1]

    [first] = wait_until(training, BOOT_S, interval_s=1, message="the worker on the one slot trains")

    # 2. The slot is taken back: a notice through the worker's metadata service, a clean leave, the end.
    with trace.open("a") as out:
        out.write('[0, "remove", {"nodes": ["a"]}]\n')

    def left() -> dict[str, Any]:
        row = next(w for w in reader.workers() if w["id"] == first["id"])
        return row if row["state"] != "running" else {}

    gone = wait_until(left, 60, message="the reclaimed worker leaves")
    assert gone["state"] == "interrupted"
    assert gone["exit_reason"].startswith("interrupted: spot interruption notice: terminate at")
    pid = int(first["launcher_handle"])
    wait_until(lambda: group_gone(pid), 120 / COMPRESS + 30, message="the reclaimed worker's processes end")
    log = orch.proc.log()
    assert f"worker {first['request_id']}: spot market reclaims it: notice" in log
    refused_before = len(refused(reader.workers()))
    wait_until(lambda: len(refused(reader.workers())) > refused_before, 30, message="no slot: refused again")

    # 3. Two slots again: the loop launches and both workers train.
    with trace.open("a") as out:
        out.write('[0, "add", {"nodes": ["a", "b"]}]\n')

    def two_training() -> list[dict[str, Any]]:
        rows = [w for w in reader.running() if w["samples"] > 0]
        return rows if len(rows) == 2 else []

    pair = wait_until(two_training, BOOT_S, interval_s=1, message="two workers train once capacity is back")
    assert first["id"] not in {w["id"] for w in pair}
    assert reader.run()["state"] == "running"


@pytest.mark.swarm
@pytest.mark.timeout(420)
def test_a_market_without_capacity_is_asked_ever_less_often_never_fails_the_run_and_is_used_when_back(
    processes: ProcessRegistry, loop_data_dir: Path, tmp_path: Path
) -> None:
    """No capacity for a while (more refusals than the start-failure budget that fails a run), then one
    slot: the run waits, the launches it tries come ever further apart, and a worker trains soon after."""
    none_now = '[0, "add", {"nodes": ["a"]}]\n[0, "remove", {"nodes": ["a"]}]\n'  # peak 1, none now
    trace, market_env = spot_market(tmp_path, none_now, slots=1, compress=COMPRESS)
    cap_s = 4.0
    env = {
        **market_env,
        "SPOTSWARM_LAUNCH_BACKOFF_BASE_S": "1",
        "SPOTSWARM_LAUNCH_BACKOFF_CAP_S": str(cap_s),
        "SPOTSWARM_MAX_START_FAILURES": "3",  # start-up failures this often fail a run; refusals never
    }
    orch = start_loop_orchestrator(processes, loop_data_dir, extra_env=env)
    admin_post(orch, api.runs(), digits_run("dry-market", desired_workers=1, stop={"target_epochs": 100_000}))
    reader = RunReader(orch, "dry-market")

    def six_refused() -> list[dict[str, Any]]:
        rows = refused(reader.workers())
        return rows if len(rows) >= 6 else []

    refusals = wait_until(six_refused, 90, message="six launches refused for capacity")
    assert reader.run()["state"] == "pending", reader.run()["state_reason"]
    starts = [datetime.fromisoformat(w["created_at"]) for w in refusals]
    gaps_s = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(starts)]
    # 1, 2, 4, 4, 4 s (plus a tick each): the market is asked ever less often, up to the cap
    assert gaps_s[2] >= 3.5 and gaps_s[-1] >= cap_s * 0.9, gaps_s
    assert all(later >= earlier * 0.8 for earlier, later in itertools.pairwise(gaps_s)), gaps_s
    print("gaps between launches the market refused (s):", [round(gap, 1) for gap in gaps_s])  # pytest -s
    kinds = {e["kind"] for e in reader.events()}
    assert "run.no_capacity" in kinds and "run.start_failure" not in kinds, kinds

    with trace.open("a") as out:
        out.write('[0, "add", {"nodes": ["a"]}]\n')
    back_at = datetime.now().astimezone()

    def launched() -> list[dict[str, Any]]:
        return [w for w in reader.workers() if w["launcher_handle"]]

    [worker] = wait_until(launched, cap_s + 10, message="a launch soon after capacity is back")
    launch_after_s = (datetime.fromisoformat(worker["created_at"]) - back_at).total_seconds()
    print(f"capacity back -> launch {launch_after_s:.1f} s")
    assert launch_after_s <= cap_s + 2
    wait_until(
        lambda: [w for w in reader.running() if w["samples"] > 0], BOOT_S, interval_s=1, message="it trains"
    )
    assert reader.run()["state"] == "running"
