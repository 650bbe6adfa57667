"""``/metrics``: the Prometheus series of hand-joined workers match the API and vanish with their run; the
read rule (reads need the admin token here). The app in-process."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.cli.output import parse_time
from tests.support import api
from tests.support.checkpoint_files import checkpoint_bytes
from tests.support.inprocess import InProcessOrchestrator as Orchestrator
from tests.support.operability import (
    OPERABILITY_ENV,
    admin_get,
    create,
    join,
    launch_intent,
    scrape,
    scrape_until,
    value,
)
from tests.support.waiting import wait_until
from tests.support.workers import become_checkpointer
from worker.protocol.workers import DeregisterReason

ORCHESTRATOR_ENV = OPERABILITY_ENV
PRICE_USD_PER_HOUR = 3.6
OTHER_PRICE_PER_HOUR = 100.0  # price_per_hour set too: price_usd_per_hour wins (the docs' precedence)
TARGET_SAMPLES = 2256


@pytest.mark.timeout(180)
def test_metrics_match_the_api_and_vanish_with_the_run(api_app: Orchestrator, tmp_path: Path) -> None:
    in_samples = {"stop": {"target_samples": TARGET_SAMPLES}, "strategy_options": {"sync": "gradients"}}
    name, join_token = create(api_app, desired_workers=1, **in_samples)
    prices = {"price_usd_per_hour": PRICE_USD_PER_HOUR, "price_per_hour": OTHER_PRICE_PER_HOUR}
    request_id, launch_token = launch_intent(api_app, name, prices)
    worker = join(api_app, launch_token, request_id)
    numbers = dict(local_step=9, swarm_epoch=4, samples=256, loss=0.25, samples_per_s=32.0, num_peers=1)
    become_checkpointer(
        api_app, {"worker_id": worker.worker_id, "worker_token": worker.client.token}, **numbers
    )
    checkpoint = tmp_path / "epoch4.ckpt"
    checkpoint.write_bytes(checkpoint_bytes(b"weights" * 100))
    worker.client.upload_checkpoint(worker.worker_id, 4, checkpoint)
    with api_app.client() as anonymous:
        refused = anonymous.post(api.heartbeat(worker.worker_id), json={})
        assert refused.status_code == 401
        assert anonymous.get("/metrics").status_code == 401  # reads are not public here
    with api_app.client(join_token) as http:
        assert http.get("/metrics").status_code == 403

    samples = scrape_until(api_app, lambda s: s.get(("spotswarm_run_samples_total", (("run", name),))) == 256)
    run = admin_get(api_app, api.run(name))
    assert (
        value(samples, "spotswarm_run_workers", run=name, state="running") == run["workers"]["running"] == 1
    )
    assert value(samples, "spotswarm_run_workers", run=name, state="launching") == 0
    assert value(samples, "spotswarm_run_desired_workers", run=name) == run["workers"]["desired"] == 1
    assert value(samples, "spotswarm_run_swarm_epoch", run=name) == run["reported"]["swarm_epoch"] == 4
    assert value(samples, "spotswarm_run_loss", run=name) == run["reported"]["loss"] == 0.25
    assert value(samples, "spotswarm_run_samples_per_second", run=name) == 32.0
    assert run["eta_s"] == pytest.approx((TARGET_SAMPLES - 256) / 32.0)  # the server's ETA
    assert value(samples, "spotswarm_run_state", run=name, state="running") == 1
    assert value(samples, "spotswarm_run_state", run=name, state="pending") == 0
    assert value(samples, "spotswarm_run_checkpoints", run=name) == 1
    assert value(samples, "spotswarm_run_checkpoint_latest_epoch", run=name) == 4
    assert 0 <= value(samples, "spotswarm_run_checkpoint_latest_age_seconds", run=name) < 120
    assert value(samples, "spotswarm_run_checkpoint_bytes", run=name) == checkpoint.stat().st_size
    cost = value(samples, "spotswarm_run_cost_usd", run=name)
    assert 0 < cost < PRICE_USD_PER_HOUR * 120 / 3600  # registered less than two minutes ago
    assert value(samples, "spotswarm_heartbeats_total", result="accepted") >= 1
    assert value(samples, "spotswarm_heartbeats_total", result="rejected") >= 1
    assert value(samples, "spotswarm_dht_up") == 1
    routes = {dict(labels)["route"] for (n, labels) in samples if n.startswith("spotswarm_http_request")}
    assert "/api/v1/workers/{worker_id}/heartbeat" in routes and "/metrics" in routes
    assert not [r for r in routes if re.search(r"/\d+(/|$)", r) or name in r], routes  # templates only

    with api_app.admin() as http:
        assert http.post(api.run_stop(name)).status_code == 200
    worker.leave(DeregisterReason.stopped)
    wait_until(lambda: admin_get(api_app, api.run(name))["state"] == "stopped", 15)
    samples = scrape(api_app)
    assert value(samples, "spotswarm_run_state", run=name, state="stopped") == 1
    # The worker has ended, so its cost is fixed: the run view, the worker view and /metrics show the
    # one value the server computed, from price_usd_per_hour.
    run = admin_get(api_app, api.run(name))
    (listed,) = admin_get(api_app, api.run_workers(name))["items"]
    assert (
        run["cost_usd"]
        == listed["cost_usd"]
        == pytest.approx(value(samples, "spotswarm_run_cost_usd", run=name))
    )
    hours = (parse_time(listed["ended_at"]) - parse_time(listed["registered_at"])).total_seconds() / 3600
    assert run["cost_usd"] == pytest.approx(PRICE_USD_PER_HOUR * hours)
    assert run["eta_s"] is None  # finished
    with api_app.admin() as http:
        assert http.delete(api.run(name)).status_code == 204
    assert not [key for key in scrape(api_app) if ("run", name) in key[1]], "series of a deleted run remain"
