"""The run page shows churn, in a real headless Chromium against a real orchestrator: live against
desired workers over time, a mark where a worker left after a spot notice and one where a worker was
lost, and the run's goodput over the last hour.

Workers join by hand and heartbeat from a thread (no reconcile loop: it would launch real workers); the
lost one is moved to ``lost`` through the function the loop calls when heartbeats stop.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.support import api
from tests.support.browser import chart_points, open_browser
from tests.support.cli import Beater, HandWorker
from tests.support.orchestrator import HAND_ONLY, Orchestrator, start_orchestrator
from tests.support.processes import ProcessRegistry
from tests.support.specs import run_spec
from tests.support.waiting import wait_until
from tests.support.workers import mark_lost
from worker.protocol.workers import DeregisterReason

pytestmark = pytest.mark.browser
RUN = "churn-demo"


def last_point(orch: Orchestrator) -> dict[str, Any]:
    with orch.client() as http:
        response = http.get(api.run_progress(RUN))
    response.raise_for_status()
    return dict(response.json()["points"][-1])


def events_drawn(page: Page, chart_id: str) -> int:
    return int(page.locator(f"#{chart_id}").get_attribute("data-events") or 0)


@pytest.mark.timeout(90)
def test_page_charts_live_against_desired_marks_notice_and_loss_and_shows_goodput(
    processes: ProcessRegistry, tmp_path: Path
) -> None:
    orch: Orchestrator = start_orchestrator(processes, tmp_path / "data", extra_env=HAND_ONLY)
    with orch.admin() as http:
        created = http.post(api.runs(), json=run_spec(RUN, desired_workers=3))
    assert created.status_code == 201, created.text
    join = created.json()["join_token"]
    # the run trains in the default mode, DiLoCo: the workers report the samples their rounds kept
    staying, noticed, lost = (HandWorker(orch, join, f"host-{n}", rounds=True) for n in "abc")
    beater = Beater([staying, noticed, lost])
    beater.start()
    try:
        with open_browser() as browser:
            page = browser.page
            page.goto(f"{orch.url}/runs/{RUN}")
            wait_until(
                lambda: chart_points(page, "workers-chart") >= 6, 30, message="workers chart has points"
            )
            expect(page.locator('#workers-chart path[data-series="live"]')).to_have_count(1)
            expect(page.locator('#workers-chart path[data-series="desired"]')).to_have_count(1)
            assert chart_points(page, "progress-chart") >= 3
            expect(page.locator("#goodput-tile")).to_have_attribute("title", re.compile("steady swarm"))

            beater.drop(noticed)
            noticed.leave(DeregisterReason.interrupted, "spot interruption notice: terminate")
            beater.drop(lost)
            mark_lost(orch, lost.worker_id, "no heartbeat for 10 s")

            for chart in ("progress-chart", "workers-chart"):
                expect(page.locator(f"#{chart} line.event-notice")).to_have_count(1, timeout=20_000)
                expect(page.locator(f"#{chart} line.event-loss")).to_have_count(1)
            notice = page.locator("#progress-chart line.event-notice title")
            expect(notice).to_contain_text(f"worker {noticed.worker_id}")
            expect(page.locator("#progress-chart line.event-loss title")).to_contain_text(
                f"lost: worker {lost.worker_id}"
            )
            # the live line falls to 1 while desired stays at 3
            wait_until(
                lambda: last_point(orch)["live_workers"] == 1,
                20,
                message="a sample with one live worker",
            )
            assert last_point(orch)["desired_workers"] == 3
            # one steady worker completes epochs: goodput is measured and shown
            expect(page.locator("#t-goodput")).to_have_text(re.compile(r"^\d+%$"), timeout=30_000)
            expect(page.locator("#t-goodput-detail")).to_contain_text("samples/s per worker")
            assert events_drawn(page, "progress-chart") == 2
            browser.screenshot(tmp_path / "churn-view.png")
            assert not browser.problems, browser.problems
    finally:
        beater.stop()
