"""Workers with the default strategy options train one model: once their swarm has formed, they average at
least 0.9 of their epochs. Four workers with admission on (digits, ``target_batch_size`` 2048), and two
with admission off, the configurations in which a split swarm was reported (every epoch ``alone``).

Real `spotswarm serve` with the reconcile loop and local digits workers, nothing in ``strategy_options``
but ``swarm_admission``. The share is counted from the moment each worker has averaged once: epochs a
worker trains before its partners are up are ``alone`` by necessity, not a split.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import ProcessRegistry
from tests.support.runs import RunReader, admin_post, digits_run, start_loop_orchestrator
from tests.support.waiting import BOOT_S, wait_until
from worker.wire import AVERAGING_OUTCOMES

pytestmark = [pytest.mark.swarm]
ENV = {"SPOTSWARM_CHECK_IMPORTS": "false"}
EPOCHS_PER_WORKER = 6  # measured after the swarm formed: each at least 5 s with the default matchmaking
AVERAGED_SHARE = 0.9


def _counts(workers: list[dict[str, Any]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for worker in workers:
        for key, value in (worker["averaging"] or {}).items():
            if key in AVERAGING_OUTCOMES:  # epochs, not group sizes or seconds
                total[key] = total.get(key, 0) + int(value)
    return total


def _all_averaged_once(reader: RunReader, workers: int) -> list[dict[str, Any]] | None:
    running = reader.running()
    formed = len(running) == workers and all((w["averaging"] or {}).get("averaged", 0) > 0 for w in running)
    return running if formed else None


@pytest.mark.timeout(420)
@pytest.mark.parametrize(
    ("workers", "target_batch_size", "options"),
    [(4, 2048, {}), (2, 256, {"swarm_admission": False})],
    ids=["four-admission-on", "two-admission-off"],
)
def test_workers_with_default_options_average_nearly_every_epoch(
    processes: ProcessRegistry,
    loop_data_dir: Path,
    workers: int,
    target_batch_size: int,
    options: dict[str, Any],
) -> None:
    orch = start_loop_orchestrator(processes, loop_data_dir, extra_env=ENV)
    spec = digits_run(
        "defaults", target_batch_size=target_batch_size, strategy_options=options, desired_workers=workers
    )
    admin_post(orch, "/api/v1/runs", spec)
    reader = RunReader(orch, "defaults")
    formed = wait_until(
        lambda: _all_averaged_once(reader, workers),
        BOOT_S,
        interval_s=1.0,
        message=lambda: f"each of {workers} workers averaged once: {reader.running()}",
    )
    before = _counts(formed)

    def window() -> dict[str, int]:
        after = _counts(reader.running())
        return {key: after.get(key, 0) - before.get(key, 0) for key in after}

    wanted = EPOCHS_PER_WORKER * workers
    outcomes = wait_until(
        lambda: (w := window()) and sum(w.values()) >= wanted and w,
        180,
        interval_s=1.0,
        message=lambda: f"{wanted} worker-epochs: {window()}",
    )
    epochs = sum(outcomes.values())
    print(f"outcomes {outcomes} over {epochs} worker-epochs; load average {os.getloadavg()[0]:.1f}")
    assert outcomes["averaged"] >= AVERAGED_SHARE * epochs, outcomes
    assert reader.run()["averaging"]["warning"] is None
