"""A DiLoCo run through the orchestrator (``strategy_options: {"sync": "diloco"}``) on two local workers
pinned to a core each (``launcher_options: {"cpus_per_worker": 1}``): its rounds are the swarm epochs the
run's stop condition, checkpoints and view count, its workers average in rounds, its checkpoint's model
is the global weights (with the outer optimizer's state beside them), and the run view, `runs show` and
the status page (headless Chromium) show the sync mode, the rounds, the share of time the workers waited
on averaging and G. Real `spotswarm serve` with the reconcile loop."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
import torch
from playwright.sync_api import expect

from tests.support import api
from tests.support.browser import open_browser
from tests.support.cli import cli
from tests.support.orchestrator import Orchestrator
from tests.support.runs import RunReader, admin_post, digits_run
from tests.support.waiting import BOOT_S, wait_until

pytestmark = [pytest.mark.swarm, pytest.mark.browser]
ROUNDS = 8


@pytest.mark.timeout(420)
def test_a_diloco_run_of_two_pinned_workers_completes_in_rounds(
    loop_orch: Orchestrator, tmp_path: Path
) -> None:
    options = {"matchmaking_time": 1.0, "averaging_timeout": 10.0, "sync": "diloco", "sync_every_s": 2.0}
    spec = digits_run(
        "diloco",
        strategy_options=options,
        launcher_options={"cpus_per_worker": 1},
        stop={"target_epochs": ROUNDS},
        checkpoint_every_epochs=4,
    )
    admin_post(loop_orch, api.runs(), spec)
    reader = RunReader(loop_orch, "diloco")
    final = wait_until(
        lambda: (run := reader.run())["state"] in ("completed", "failed", "stopped") and run,
        BOOT_S + 180,
        message=lambda: f"the run reaches {ROUNDS} rounds: {reader.run().get('reported')}",
    )
    assert final["state"] == "completed", final["state_reason"]
    assert final["reported"]["swarm_epoch"] >= ROUNDS
    workers = [w for w in reader.workers() if w["registered_at"]]
    assert len(workers) >= 2, "two workers trained"
    counts = [w["averaging"] for w in workers if w["averaging"]]
    assert sum(c["averaged"] for c in counts) >= 1, counts  # rounds together, not two models apart
    latest = max(reader.checkpoints(), key=lambda c: c["epoch"])
    assert latest["epoch"] >= ROUNDS - 4
    with loop_orch.admin() as http:
        response = http.get(latest["download_path"])
    assert response.status_code == 200, response.text
    checkpoint = torch.load(io.BytesIO(response.content), weights_only=True)
    state = checkpoint["optimizer_states"][0]
    assert state["state"]["local_epoch"] == latest["epoch"]
    assert {"stepped", "tensors"} <= set(state["diloco"]) and state["diloco"]["stepped"]
    model = list(checkpoint["state_dict"].values())
    global_weights = state["diloco"]["tensors"][: len(model)]  # then the outer momentum
    assert all(torch.equal(a, b) for a, b in zip(model, global_weights, strict=True))  # the run's model

    assert final["sync"] == "diloco"
    window = final["averaging"]
    assert 0 < window["waiting_share"] < 1 and window["g"] > 0, window  # rounds blocked, compute did not
    shown = cli(loop_orch, "runs", "show", "diloco")
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert any(line.split()[:2] == ["sync", "diloco"] for line in lines), shown.output
    assert any(line.split()[:1] == ["rounds"] for line in lines), shown.output
    assert "of worker time on averaging, G " in shown.output, shown.output
    with loop_orch.client() as http:
        scraped = http.get("/metrics").text
    assert 'spotswarm_run_averaging_g{run="diloco"}' in scraped, scraped[-2000:]
    assert 'spotswarm_run_averaging_waiting_share{run="diloco"}' in scraped
    watched = cli(loop_orch, "runs", "watch", "diloco")  # a completed run: one line, exit 0
    assert watched.exit_code == 0 and re.search(r"  waiting \d+%  G [\d.]+  ", watched.output), watched.output
    exported = tmp_path / "diloco.ckpt"
    done = cli(loop_orch, "runs", "export", "diloco", "--epoch", str(latest["epoch"]), "-o", str(exported))
    assert done.exit_code == 0, done.output
    export = torch.load(exported, weights_only=True)
    assert all(torch.equal(a, b) for a, b in zip(export["state_dict"].values(), global_weights, strict=True))
    with open_browser() as browser:
        page = browser.page
        page.goto(loop_orch.url + "/runs/diloco")
        expect(page.locator("#t-epoch-label")).to_have_text("rounds", timeout=20_000)
        expect(page.locator("#t-sync")).to_have_text("sync: diloco")
        expect(page.locator("#t-waiting")).to_have_text(re.compile(r"^\d+%$"))
        expect(page.locator("#t-waiting-detail")).to_contain_text("G ")
        assert browser.problems == [], browser.problems
