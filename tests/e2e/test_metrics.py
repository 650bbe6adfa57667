"""Prometheus metrics of a real training run: `spotswarm serve` with the reconcile loop and the local
launcher, two digits workers; the metrics agree with the API while the swarm trains, workers log JSON
lines that the API serves, and the run's series vanish when it is deleted."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import api
from tests.support.orchestrator import Orchestrator
from tests.support.processes import REPO_ROOT, ProcessRegistry
from tests.support.runs import RunReader, admin_post, digits_run, start_loop_orchestrator
from tests.support.waiting import BOOT_S, wait_until

pytestmark = [pytest.mark.swarm]
RUN = "metered"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(orch: Orchestrator) -> Samples:
    response = httpx.get(f"{orch.url}/metrics", timeout=15)
    response.raise_for_status()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def served_names(orch: Orchestrator) -> tuple[set[str], set[str]]:
    """(family names, sample names with their _total/_bucket/... suffixes) of one scrape."""
    families = list(text_string_to_metric_families(httpx.get(f"{orch.url}/metrics", timeout=15).text))
    return {f.name for f in families}, {s.name for f in families for s in f.samples}


def names_in(path: Path) -> set[str]:
    return set(re.findall(r"\bspotswarm_[a-z_]+[a-z]", path.read_text()))


def metric(orch: Orchestrator, name: str, **labels: str) -> float | None:
    return scrape(orch).get((name, tuple(sorted(labels.items()))))


@pytest.mark.timeout(330)
def test_metrics_follow_a_training_run_and_vanish_when_it_is_deleted(
    processes: ProcessRegistry, loop_data_dir: Path
) -> None:
    env = {"SPOTSWARM_CHECK_IMPORTS": "false", "SPOTSWARM_LOG_FORMAT": "json"}  # workers inherit the env
    orch = start_loop_orchestrator(processes, loop_data_dir, extra_env=env)
    admin_post(orch, api.runs(), digits_run(RUN, target_batch_size=64, checkpoint_every_epochs=2))
    reader = RunReader(orch, RUN)
    wait_until(lambda: len(reader.running()) == 2 and reader.epoch() >= 1, BOOT_S, message="2 workers train")

    samples = scrape(orch)
    run = reader.run()
    by_state = {
        s: samples[("spotswarm_run_workers", (("run", RUN), ("state", s)))] for s in ("running", "lost")
    }
    assert by_state == {"running": run["workers"]["running"], "lost": 0} and by_state["running"] == 2
    assert samples[("spotswarm_run_desired_workers", (("run", RUN),))] == 2
    assert samples[("spotswarm_launches_total", (("launcher", "local"),))] >= 2
    assert samples[("spotswarm_reconcile_ticks_total", ())] > 0
    assert samples[("spotswarm_reconcile_errors_total", ())] == 0
    assert samples[("spotswarm_heartbeats_total", (("result", "accepted"),))] > 0
    epoch = samples[("spotswarm_run_swarm_epoch", (("run", RUN),))]
    assert epoch >= 1 and epoch <= reader.epoch()

    wait_until(lambda: (metric(orch, "spotswarm_run_swarm_epoch", run=RUN) or 0) > epoch, 90, message="epoch")
    wait_until(
        lambda: metric(orch, "spotswarm_run_dht_peers", run=RUN) == 2, 60, message="2 peers in the DHT"
    )
    samples = scrape(orch)
    assert samples[("spotswarm_run_samples_total", (("run", RUN),))] > 0
    assert samples[("spotswarm_run_samples_per_second", (("run", RUN),))] > 0
    assert ("spotswarm_run_loss", (("run", RUN),)) in samples
    assert samples[("spotswarm_run_dht_epoch", (("run", RUN),))] >= epoch

    wait_until(lambda: metric(orch, "spotswarm_run_checkpoints", run=RUN), 60, message="a checkpoint")
    families, samples_named = served_names(orch)
    served = families | samples_named | {"spotswarm_run_cost_usd"}  # no price: the local launcher
    for used_in in ("deploy/grafana/spotswarm-dashboard.json", "deploy/prometheus/spotswarm-alerts.yml"):
        assert names_in(REPO_ROOT / used_in) <= served, (used_in, names_in(REPO_ROOT / used_in) - served)
    documented = names_in(REPO_ROOT / "docs/operations/metrics.md")
    assert documented <= served, documented - served
    ours = {f for f in families if not f.endswith("_created")}  # prometheus_client's extra series
    undocumented = {f for f in ours if f not in documented and f"{f}_total" not in documented}
    assert not undocumented, undocumented

    worker = reader.running()[0]
    with orch.admin() as http:  # logs need the admin token
        tail = http.get(api.run_worker_log(RUN, worker["id"]), params={"tail_bytes": 65536}).json()
    lines = [json.loads(line) for line in tail["text"].splitlines() if line.startswith("{")]
    assert any(line["run"] == RUN and line["worker"] == worker["id"] for line in lines), tail["text"][-2000:]

    admin_post(orch, api.run_stop(RUN))
    wait_until(lambda: reader.run()["state"] == "stopped", 90, message="the run stops")
    with orch.admin() as http:
        assert http.delete(api.run(RUN)).status_code == 204
    left = [key for key in scrape(orch) if ("run", RUN) in key[1]]
    assert not left, left
