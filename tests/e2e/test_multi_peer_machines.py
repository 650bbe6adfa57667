"""Machines of several peers end to end (``launcher_options: {"peers_per_machine": 2}``): a real `spotswarm
serve` whose local launcher obeys a simulated spot market of one slot, and a run that wants two workers
of the digits example (DiLoCo, the tests' fast rounds). One slot is one machine: both peers start on it,
each its own worker row, and both train; when the market takes the slot back, both peers get the
instance's notice through their metadata service and leave as ``interrupted``.

Marked ``swarm`` though what it asserts (each peer trains, each leaves at the notice) is each worker's
own doing: its two workers' rounds and heartbeats hold their bounds only with the CPU the swarm lanes get
(the lanes' rule, CONTRIBUTING.md). It takes about 15 s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support import api
from tests.support.processes import ProcessRegistry
from tests.support.runs import RunReader, admin_post, digits_run, start_loop_orchestrator
from tests.support.spot_market import spot_market
from tests.support.waiting import BOOT_S, wait_until

COMPRESS = 4.0  # EC2's 120 s notice in 30 s: a worker leaves at once, with time to do it on a busy machine


@pytest.mark.swarm
@pytest.mark.timeout(300)
def test_two_peers_share_one_machine_train_together_and_both_leave_at_its_reclaim(
    processes: ProcessRegistry, loop_data_dir: Path, tmp_path: Path
) -> None:
    trace, env = spot_market(
        tmp_path, '[0, "add", {"nodes": ["a"]}]\n', slots=1, compress=COMPRESS
    )  # one slot
    orch = start_loop_orchestrator(processes, loop_data_dir, extra_env=env)
    spec = digits_run(
        "two-per-machine",
        desired_workers=2,
        launcher_options={"peers_per_machine": 2},
        stop={"target_epochs": 100_000},
    )
    admin_post(orch, api.runs(), spec)
    reader = RunReader(orch, "two-per-machine")

    def both_training() -> list[dict[str, Any]]:
        rows = [w for w in reader.running() if w["samples"] > 0]
        return rows if len(rows) == 2 else []

    pair = wait_until(both_training, BOOT_S + 60, interval_s=1, message="both peers of the machine train")
    assert len(reader.workers()) == 2, "one machine of two peers in the one slot: no launch refused"
    assert len({w["request_id"] for w in pair}) == 2

    with trace.open("a") as out:
        out.write('[0, "remove", {"nodes": ["a"]}]\n')

    def both_left() -> list[dict[str, Any]]:
        rows = [w for w in reader.workers() if w["id"] in {p["id"] for p in pair}]
        return rows if all(w["state"] != "running" for w in rows) else []

    left = wait_until(both_left, 90, interval_s=1, message="both peers leave at the machine's reclaim")
    assert [w["state"] for w in left] == ["interrupted", "interrupted"], [w["exit_reason"] for w in left]
    assert all(w["exit_reason"].startswith("interrupted: spot interruption notice") for w in left)
    assert orch.proc.log().count("spot market reclaims it: notice") == 1, "one reclaim, of the machine"
