"""A run created after another was deleted trains one model: its workers average with each other.

SQLite hands out the largest id again once the row holding it is deleted (an ``INTEGER PRIMARY KEY``
without ``AUTOINCREMENT``), so the workers of the next run used to get the deleted run's worker ids (a
review saw such runs train every epoch alone; here they averaged, with the ids reused or not: see the
averaging benchmark page). Real `spotswarm serve` with the reconcile loop on SQLite, two local digits
workers per run, swarm admission at its default (on).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import api
from tests.support.processes import ProcessRegistry
from tests.support.runs import RunReader, admin_post, digits_run, start_loop_orchestrator
from tests.support.waiting import BOOT_S, wait_until

pytestmark = [pytest.mark.swarm]
AVERAGED_EPOCHS = 2  # per worker: rounds that only succeed when the two find each other
ENV = {"SPOTSWARM_PROGRESS_SAMPLE_INTERVAL_S": "2", "SPOTSWARM_CHECK_IMPORTS": "false"}


def _both_averaged(reader: RunReader) -> list[dict[str, Any]] | None:
    workers = reader.running()
    done = len(workers) == 2 and all(
        (w["averaging"] or {}).get("averaged", 0) >= AVERAGED_EPOCHS for w in workers
    )
    return workers if done else None


def _train_until_averaged(reader: RunReader) -> list[dict[str, Any]]:
    try:
        return wait_until(
            lambda: _both_averaged(reader),
            BOOT_S,
            interval_s=1.0,
            message=f"each worker of {reader.name} averaged {AVERAGED_EPOCHS} epochs",
        )
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: workers {reader.running()}") from exc


@pytest.mark.timeout(600)
def test_the_run_after_a_deleted_one_gets_new_worker_ids_and_averages(
    processes: ProcessRegistry, loop_data_dir: Path
) -> None:
    orch = start_loop_orchestrator(processes, loop_data_dir, extra_env=ENV)
    first = RunReader(orch, "first")
    admin_post(orch, api.runs(), digits_run("first"))
    old_ids = {w["id"] for w in _train_until_averaged(first)}
    first.admin_post("/stop")
    wait_until(lambda: first.run()["state"] == "stopped", 120, message="first run stopped")
    with orch.admin() as http:
        http.delete(api.run("first"), timeout=60).raise_for_status()

    second = RunReader(orch, "second")
    admin_post(orch, api.runs(), digits_run("second"))
    wait_until(lambda: len(second.running()) == 2, BOOT_S, message="the second run's two workers registered")
    new_ids = {w["id"] for w in second.running()}
    assert not new_ids & old_ids, f"ids of the deleted run's workers handed out again: {new_ids & old_ids}"
    _train_until_averaged(second)
    with orch.client() as http:
        assert http.get(api.run("first")).status_code == httpx.codes.NOT_FOUND
