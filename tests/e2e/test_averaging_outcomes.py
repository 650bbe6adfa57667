"""A run whose workers cannot average is impossible to miss: the averaged fraction and the warning in the
API, the CLI, ``/metrics`` and the status page (headless Chromium). Real `spotswarm serve` with the
reconcile loop, two local workers with swarm admission on (the default) whose gradient averagers refuse
every round (``tests/e2e/lifecycle_models.py``), so each worker trains alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.support import api
from tests.support.browser import open_browser
from tests.support.cli import cli
from tests.support.orchestrator import Orchestrator
from tests.support.processes import ProcessRegistry
from tests.support.runs import GRADIENTS, RunReader, admin_post, digits_run, start_loop_orchestrator
from tests.support.waiting import BOOT_S, wait_until

pytestmark = [pytest.mark.swarm, pytest.mark.browser]
MODELS = "tests.e2e.lifecycle_models"
WINDOW_S = 10.0  # the judged window (300 s by default): short, so that the test stays short


def scraped(orch: Orchestrator, prefix: str) -> dict[str, float]:
    """The ``/metrics`` lines starting with ``prefix``: line without its value -> value."""
    with orch.client() as http:
        text = http.get("/metrics").text
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix)
    }


@pytest.mark.timeout(420)
def test_a_run_whose_rounds_all_time_out_shows_the_averaging_warning_everywhere(
    processes: ProcessRegistry, loop_data_dir: Path
) -> None:
    env = {"SPOTSWARM_AVERAGING_WINDOW_S": str(WINDOW_S), "SPOTSWARM_PROGRESS_SAMPLE_INTERVAL_S": "2"}
    orch = start_loop_orchestrator(processes, loop_data_dir, extra_env=env)
    options = dict(GRADIENTS)  # its gradient rounds are refused; admission left at its default (on)
    spec = digits_run("apart", module=f"{MODELS}:NoAveragingDigitsModule", strategy_options=options)
    spec["datamodule"] = f"{MODELS}:DigitsDataModule"
    admin_post(orch, api.runs(), spec)
    reader = RunReader(orch, "apart")
    # the warning comes at once (the swarm never formed: domain/swarm_forming.py); the window's figures
    # once it is covered
    run = wait_until(
        lambda: (w := (r := reader.run()).get("averaging") or {}).get("warning") and w["covered"] and r,
        BOOT_S + 4 * WINDOW_S,
        message="the averaging warning over a covered window",
    )
    window = run["averaging"]
    assert window["covered"] and window["live_workers"] == 2, window
    assert window["epochs"] >= 2 and (window["averaged_fraction"] or 0.0) < 0.5, window
    local = sum(window["outcomes"][k] for k in ("alone", "no_group", "timeout", "failed"))
    assert local > window["outcomes"]["averaged"], window
    assert "averaging_timeout" in window["warning"] and "reach each other" in window["warning"]
    events = [e for e in reader.events() if e["kind"] == "run.averaging"]
    assert len(events) == 1 and events[0]["message"] == window["warning"], events
    workers = [w for w in reader.workers() if w["state"] == "running"]
    assert len(workers) == 2 and all(w["averaging"] for w in workers), workers
    assert all((w["averaged_fraction"] or 0.0) < 0.5 for w in workers), workers

    shown = cli(orch, "runs", "show", "apart")
    assert shown.exit_code == 0, shown.output
    assert "WARNING" in shown.output and f"worker-epochs in the last {WINDOW_S:g} s" in shown.output
    listed = cli(orch, "workers", "list", "apart")
    assert listed.exit_code == 0 and "AVERAGED" in listed.output.splitlines()[0], listed.output
    assert listed.output.count("0% of ") == 2, listed.output

    metrics = scraped(orch, "spotswarm_run_averaging")
    assert metrics['spotswarm_run_averaging_warning{run="apart"}'] == 1.0, metrics
    local_total = sum(
        value
        for key, value in metrics.items()
        if key.startswith("spotswarm_run_averaging_epochs_total{")
        and 'run="apart"' in key
        and 'outcome="averaged"' not in key
    )
    assert local_total >= local, metrics
    labels = {key.split('outcome="')[1].split('"')[0] for key in metrics if 'outcome="' in key}
    assert labels <= {"averaged", "alone", "no_group", "timeout", "failed", "downloaded"}, labels

    with open_browser() as browser:
        page = browser.page
        page.goto(orch.url + "/runs/apart")
        expect(page.locator("#averaging-warning")).to_be_visible(timeout=20_000)
        expect(page.locator("#averaging-warning")).to_contain_text("averaging_timeout")
        assert page.locator("#t-averaged").inner_text().endswith("%")
        cells = page.locator("#workers tbody tr[data-state=running] td.averaged")
        wait_until(lambda: cells.count() == 2, 20, message="two running workers on the page")
        assert all(text.endswith("%") for text in cells.all_inner_texts()), cells.all_inner_texts()
        # the loss chart shades the spans whose epochs were mostly local
        wait_until(lambda: page.locator("#loss-chart rect.mark").count() >= 1, 20, message="local spans")
        assert browser.problems == [], browser.problems
