"""A run whose workers never average says so within seconds, however short it is: the warning in the API's
run view, `spotswarm runs show` and the status page, a line in each worker's log, and a note in the state
the run ends in.

The averaging window (300 s by default) judged the run only once covered: a split swarm could train, or
complete, as N separate models without a word. Real `spotswarm serve` with the reconcile loop and two
local workers whose progress records are kept apart (``tests/e2e/lifecycle_models.py``), so each counts
itself alone: what a split DHT looks like to its peers.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.support import api
from tests.support.browser import open_browser
from tests.support.cli import cli
from tests.support.processes import ProcessRegistry
from tests.support.runs import RunReader, admin_post, digits_run, start_loop_orchestrator
from tests.support.waiting import BOOT_S, wait_until

pytestmark = [pytest.mark.swarm, pytest.mark.browser]
MODELS = "tests.e2e.lifecycle_models"
ENV = {"SPOTSWARM_CHECK_IMPORTS": "false"}  # the averaging window and sampling at their defaults
#: from the moment both workers train to the warning: a few epochs each, a heartbeat and a flush
WARNING_BOUND_S = 45.0


def _logs_training_alone(reader: RunReader, worker_id: str) -> bool:
    return "training alone" in reader.worker_log(worker_id)


@pytest.mark.timeout(420)
def test_a_run_whose_workers_never_average_is_warned_within_seconds_and_ends_saying_so(
    processes: ProcessRegistry, loop_data_dir: Path
) -> None:
    orch = start_loop_orchestrator(processes, loop_data_dir, extra_env=ENV)
    options = {"sync": "gradients", "matchmaking_time": 1.0, "averaging_timeout": 5.0}  # split: its records
    spec = digits_run("split", module=f"{MODELS}:SplitDigitsModule", strategy_options=options)
    spec.update(datamodule=f"{MODELS}:DigitsDataModule", target_batch_size=512)
    admin_post(orch, api.runs(), spec)
    reader = RunReader(orch, "split")
    wait_until(
        lambda: len([w for w in reader.running() if w["averaging"]]) == 2, BOOT_S, message="both train"
    )
    both_at = time.monotonic()
    run: dict[str, Any] = wait_until(
        lambda: ((r := reader.run()).get("averaging") or {}).get("warning") and r,
        WARNING_BOUND_S,
        message=lambda: f"the warning: {reader.run().get('averaging')}",
    )
    took_s = time.monotonic() - both_at
    window = run["averaging"]
    assert window["swarm_formed"] is False, window
    assert "has not formed" in window["warning"] and "none of its 2 live workers" in window["warning"]
    assert window["outcomes"]["averaged"] == 0 and window["outcomes"]["alone"] > 0, window
    events = [e for e in reader.events() if e["kind"] == "run.averaging"]
    assert [e["message"] for e in events] == [window["warning"]], events
    print(f"warned {took_s:.1f} s after both workers trained")

    shown = cli(orch, "runs", "show", "split")
    assert shown.exit_code == 0 and "WARNING" in shown.output and "has not formed" in shown.output, (
        shown.output
    )
    for worker_id in [w["id"] for w in reader.running()]:
        wait_until(
            functools.partial(_logs_training_alone, reader, worker_id),
            60,
            message=f"worker {worker_id} logs that it trains alone",
        )
    with open_browser() as browser:
        browser.page.goto(orch.url + "/runs/split")
        expect(browser.page.locator("#averaging-warning")).to_contain_text("has not formed", timeout=20_000)
        assert browser.problems == [], browser.problems

    reader.admin_post("/stop")
    ended = wait_until(
        lambda: (r := reader.run())["state"] == "stopped" and r, 120, message="the run stopped"
    )
    assert "its swarm never formed: its 2 workers trained apart" in ended["state_reason"], ended
