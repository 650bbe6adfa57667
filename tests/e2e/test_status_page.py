"""The status page in a real headless Chromium against a real orchestrator.

The first test joins workers by hand (through the real API) and drives every control of the page:
it renders, the charts have points, the token panel, the scale button, a leaving worker, a checkpoint
download, the copy button and the stop button. The second runs a real training run through the
reconcile loop and the local launcher, kills a worker on purpose and watches the page show it lost (in
the table and as a mark on the charts) and then replaced.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Page, Request, expect

from tests.support import api
from tests.support.browser import chart_points, open_browser
from tests.support.checkpoint_files import checkpoint_bytes
from tests.support.cli import Beater, HandWorker
from tests.support.orchestrator import HAND_ONLY, Orchestrator, start_orchestrator
from tests.support.processes import REPO_ROOT, ProcessRegistry
from tests.support.runs import digits_run, start_loop_orchestrator
from tests.support.specs import run_spec
from tests.support.waiting import wait_until
from worker.protocol.workers import DeregisterReason

pytestmark = pytest.mark.browser


def api_get(orch: Orchestrator, path: str) -> dict:
    with orch.client() as http:
        response = http.get("/api/v1" + path)
        response.raise_for_status()
        return dict(response.json())


@pytest.fixture
def fresh_orch(processes: ProcessRegistry, tmp_path: Path) -> Orchestrator:
    """A `spotswarm serve` of this test alone (workers joined by hand)."""
    return start_orchestrator(processes, tmp_path / "data", extra_env=HAND_ONLY)


@pytest.fixture
def hand_run(fresh_orch: Orchestrator) -> Iterator[tuple[list[HandWorker], Beater]]:
    """Run "page-demo" (stop at epoch 50) with two hand-joined workers heartbeating in a thread."""
    spec = run_spec("page-demo", desired_workers=2, stop={"target_epochs": 50})
    with fresh_orch.admin() as http:
        created = http.post(api.runs(), json=spec)
    assert created.status_code == 201, created.text
    join = created.json()["join_token"]
    workers = [
        HandWorker(fresh_orch, join, "host-a", validates=True),
        HandWorker(fresh_orch, join, "host-b", validates=True),
    ]
    beater = Beater(workers)
    beater.start()
    try:
        yield workers, beater
    finally:
        beater.stop()


def steer_with_the_token(page: Page, orch: Orchestrator) -> None:
    """Scale is refused until the token is pasted; then it changes the run's desired count."""
    page.fill("#scale-input", "3")
    page.click("#scale-button")
    expect(page.locator("#control-message")).to_contain_text("paste the admin token")
    expect(page.locator("#token-panel")).to_be_visible()
    page.fill("#token-input", orch.admin_token)
    page.click("#token-form button[type=submit]")
    assert orch.admin_token not in page.content()  # kept in localStorage, never in the page
    page.fill("#scale-input", "3")
    page.click("#scale-button")
    expect(page.locator("#control-message")).to_have_text("desired workers set to 3")
    assert api_get(orch, "/runs/page-demo")["workers"]["desired"] == 3
    expect(page.locator("#t-workers")).to_have_text("2 / 3")


@pytest.mark.timeout(90)
def test_page_shows_a_live_run_and_its_controls_work(
    fresh_orch: Orchestrator, hand_run: tuple[list[HandWorker], Beater], tmp_path: Path
) -> None:
    workers, beater = hand_run
    with open_browser() as browser:
        page = browser.page
        page.goto(fresh_orch.url + "/")
        row = page.locator('tr[data-run="page-demo"]')
        expect(row.locator("td.workers")).to_have_text("2/2")
        row.locator("a").click()
        page.wait_for_url("**/runs/page-demo")

        expect(page.locator("#run-state")).to_have_text("running")
        expect(page.locator("#t-eta")).not_to_have_text("-")  # the server's eta_s (stop at epoch 50)
        wait_until(lambda: chart_points(page, "loss-chart") >= 3, 20, message="loss chart has points")
        assert chart_points(page, "speed-chart") >= 3
        assert page.locator("#loss-chart path.series.main").count() == 1
        # the validation curve beside the loss: val_loss first; any other reported metric on demand
        wait_until(lambda: chart_points(page, "metric-chart") >= 3, 20, message="validation chart has points")
        expect(page.locator("#metric-select")).to_have_value("val_loss")
        assert page.locator('#metric-chart path.series.main[data-series="val_loss"]').count() == 1
        expect(page.locator("#t-metric-label")).to_have_text("val_loss")
        expect(page.locator("#t-metric")).not_to_have_text("-")
        page.select_option("#metric-select", "val_acc")
        expect(page.locator('#metric-chart path.series.main[data-series="val_acc"]')).to_have_count(1)
        expect(page.locator("#t-metric-label")).to_have_text("val_acc")
        first_row = page.locator(f'#workers tr[data-worker="{workers[0].worker_id}"] td.metrics')
        expect(first_row).to_contain_text("val_acc=")
        expect(first_row).to_contain_text("val_loss=")
        expect(page.locator("#events")).to_contain_text("worker.registered")
        expect(page.locator('#workers tr[data-state="running"]')).to_have_count(2)

        steer_with_the_token(page, fresh_orch)

        page.check("#per-worker")  # per-worker lines join the swarm-wide one
        expect(page.locator("#loss-chart path.series")).to_have_count(3)

        beater.drop(workers[1])
        workers[1].leave(DeregisterReason.interrupted, "spot interruption notice")
        leaver = page.locator(f'#workers tr[data-worker="{workers[1].worker_id}"]')
        expect(leaver).to_have_attribute("data-state", "interrupted")
        expect(leaver.locator("td.ended")).to_contain_text("interrupted: spot interruption notice")

        blob = tmp_path / "epoch-3.ckpt"
        blob.write_bytes(checkpoint_bytes(b"weights" * 50_000))  # what torch.save writes
        workers[0].upload(3, blob)
        link = page.locator('#checkpoints tr[data-epoch="3"] a')
        expect(link).to_have_text("download", timeout=15_000)
        with page.expect_download() as download:
            link.click()
        saved = Path(download.value.path())
        assert hashlib.sha256(saved.read_bytes()).digest() == hashlib.sha256(blob.read_bytes()).digest()

        expect(page.locator("#peers")).to_contain_text(f"/tcp/{fresh_orch.dht_port}/p2p/")
        page.click("#copy-peers")
        expect(page.locator("#copy-peers")).to_have_text("copied")

        browser.screenshot(tmp_path / "status-page-hand-run.png")
        page.once("dialog", lambda dialog: dialog.accept())
        page.click("#stop-button")
        expect(page.locator("#run-state")).to_have_text("stopping")
        assert api_get(fresh_orch, "/runs/page-demo")["state"] == "stopping"
        assert not browser.problems, browser.problems
        stored = json.dumps(page.evaluate("Object.assign({}, localStorage)"))
        assert fresh_orch.admin_token in stored  # the token survives reloads in this browser only


# -- where the admin token goes ------------------------------------------------------------------------


class Recorder:
    """The API requests a page makes: method, path and whether they carry the Authorization header."""

    def __init__(self, page: Page) -> None:
        self.calls: list[tuple[str, str, bool]] = []
        page.on("request", self._record)

    def _record(self, request: Request) -> None:
        path = urlsplit(request.url).path
        if path.startswith("/api/"):
            self.calls.append((request.method, path, "authorization" in request.headers))

    def since(self, start: int) -> list[tuple[str, str, bool]]:
        return self.calls[start:]

    def polls_since(self, page: Page, start: int, path_end: str) -> int:
        """How many GETs of a path ending in ``path_end`` the page made since ``start`` (lets Playwright
        deliver pending request events first: the sync API delivers them only inside its own calls)."""
        page.wait_for_timeout(100)
        return sum(method == "GET" and path.endswith(path_end) for method, path, _ in self.since(start))


def paste_token(page: Page, token: str) -> None:
    page.click("#token-button")
    page.fill("#token-input", token)
    page.click("#token-form button[type=submit]")


@pytest.mark.timeout(90)
def test_polls_go_without_the_admin_token_admin_calls_with_it(
    fresh_orch: Orchestrator, hand_run: tuple[list[HandWorker], Beater]
) -> None:
    args = {"module_args": {"secret_path": "s3://team-bucket/private"}}
    with fresh_orch.admin() as http:
        assert http.post(api.runs(), json=run_spec("token-rule", **args)).status_code == 201
    with open_browser() as browser:
        page = browser.page
        calls = Recorder(page)
        page.goto(fresh_orch.url + "/runs/token-rule")
        expect(page.locator("#spec-note")).to_contain_text("admin token only")
        assert "s3://team-bucket" not in page.locator("#spec").inner_text()

        pasted_at = len(calls.calls)
        paste_token(page, fresh_orch.admin_token)
        expect(page.locator("#spec")).to_contain_text("s3://team-bucket/private")  # the full view
        wait_until(
            lambda: calls.polls_since(page, pasted_at, "/workers") >= 3,
            30,
            message="the page polled a few times with the token stored",
        )
        page.fill("#scale-input", "1")
        page.click("#scale-button")
        expect(page.locator("#control-message")).to_have_text("desired workers set to 1")

        after = calls.since(pasted_at)
        with_token = [(method, path) for method, path, auth in after if auth]
        # one read of the full run when the token was pasted, and the scale call: nothing else
        assert with_token == [("GET", api.run("token-rule")), ("POST", api.run_scale("token-rule"))]
        polled = {path for method, path, auth in after if method == "GET" and not auth}
        assert {
            api.run("token-rule"),
            api.run_workers("token-rule"),
            api.run_events("token-rule"),
        } <= polled
        assert not browser.problems, browser.problems


@pytest.mark.timeout(120)
def test_without_public_reads_the_page_reads_with_the_token(
    processes: ProcessRegistry, tmp_path: Path
) -> None:
    orch = start_orchestrator(
        processes, tmp_path / "private", extra_env={**HAND_ONLY, "SPOTSWARM_PUBLIC_READS": "false"}
    )
    with orch.admin() as http:
        assert http.post(api.runs(), json=run_spec("private-run")).status_code == 201
    with open_browser(expected_statuses=(401,)) as browser:
        page = browser.page
        calls = Recorder(page)
        page.goto(orch.url + "/runs/private-run")
        expect(page.locator("#error")).to_contain_text("401")
        paste_token(page, orch.admin_token)
        expect(page.locator("#run-state")).to_have_text("pending")
        expect(page.locator("#error")).to_be_hidden()
        refused = [i for i, (_, _, auth) in enumerate(calls.calls) if not auth]
        # after the first anonymous 401 with the token stored, every read carries it
        last = refused[-1]
        assert all(auth for _, _, auth in calls.calls[last + 1 :]) and len(calls.calls) > last + 3
        assert not browser.problems, browser.problems


# -- a real run: the reconcile loop, the local launcher, training workers ------------------------------

DOCS_SCREENSHOT = REPO_ROOT / "docs" / "status-page.png"
HEARTBEAT_TIMEOUT_S = 20


def workers_of(orch: Orchestrator, run: str) -> list[dict]:
    return list(api_get(orch, f"/runs/{run}/workers?limit=100")["items"])


@pytest.mark.swarm
@pytest.mark.timeout(240)
def test_frozen_worker_shows_lost_then_replaced(
    processes: ProcessRegistry, loop_data_dir: Path, tmp_path: Path
) -> None:
    # A heartbeat timeout with room for a worker's start-up (torch, Lightning, hivemind imports) on a
    # busy 2-core machine, where 10 s made healthy workers flap between running and lost.
    env = {"SPOTSWARM_CHECK_IMPORTS": "false", "SPOTSWARM_HEARTBEAT_TIMEOUT_S": str(HEARTBEAT_TIMEOUT_S)}
    orch = start_loop_orchestrator(processes, loop_data_dir, extra_env=env)
    # stop condition never reached (the test ends first); it gives the page an ETA to show
    spec = digits_run("live-digits", stop={"target_epochs": 100_000}, checkpoint_every_epochs=5)
    with orch.admin() as http:
        assert http.post(api.runs(), json=spec).status_code == 201
    with open_browser() as browser:
        page = browser.page
        page.goto(orch.url + "/runs/live-digits")
        running = page.locator('#workers tr[data-state="running"]')
        expect(running).to_have_count(2, timeout=120_000)

        # Freeze one worker and its p2p daemon, like a machine dropping off the network: its
        # heartbeats stop, the loop marks it lost after the heartbeat timeout, terminates it and
        # launches a replacement.
        victim = next(w for w in workers_of(orch, "live-digits") if w["state"] == "running")
        os.killpg(int(victim["launcher_handle"]), signal.SIGSTOP)
        row = page.locator(f'#workers tr[data-worker="{victim["id"]}"]')
        expect(row).to_have_attribute("data-state", "lost", timeout=(HEARTBEAT_TIMEOUT_S + 30) * 1000)
        expect(row.locator("td.ended")).to_contain_text("lost: no heartbeat")
        expect(page.locator("#events")).to_contain_text("lost")
        # the loss is marked on the progress and workers charts, naming the worker
        for chart in ("progress-chart", "workers-chart"):
            mark = page.locator(f"#{chart} line.event-loss title", has_text=f"lost: worker {victim['id']} ")
            expect(mark).to_have_count(1, timeout=20_000)
        expect(running).to_have_count(2, timeout=120_000)  # the replacement
        ids = {w["id"] for w in workers_of(orch, "live-digits") if w["state"] == "running"}
        assert victim["id"] not in ids and len(ids) == 2

        wait_until(lambda: chart_points(page, "loss-chart") >= 8, 90, message="loss from real training")
        assert page.locator("#loss-chart path.series.main").count() == 1
        shot = browser.screenshot(tmp_path / "status-page.png")
        if os.environ.get("SPOTSWARM_DOCS_SCREENSHOT") == "1":
            shutil.copyfile(shot, DOCS_SCREENSHOT)
        assert not browser.problems, browser.problems
