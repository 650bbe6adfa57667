"""Operability against a real `spotswarm serve` (reads need the admin token, logs are JSON lines):
Prometheus metrics of hand-joined workers, the run's peer list, worker log tails (API and CLI), and
run events as structured log lines."""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import base58
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.cli.output import parse_time
from orchestrator.clock import utc_now
from orchestrator.db.session import Database
from orchestrator.domain import runs, workers
from tests.helpers import VENV_BIN, ProcessRegistry, wait_until
from tests.integration.cli_support import cli
from tests.integration.worker_support import become_checkpointer
from tests.orchestrator_fixture import NO_RECONCILE, Orchestrator, run_spec, start_orchestrator
from worker.agent.client import OrchestratorClient
from worker.wire import DeregisterReason, Heartbeat, WorkerRegister

_names = itertools.count()
PRICE_USD_PER_HOUR = 3.6
OTHER_PRICE_PER_HOUR = 100.0  # price_per_hour set too: price_usd_per_hour wins (the docs' precedence)
TARGET_SAMPLES = 2256
JSON_FIELDS = {"timestamp", "level", "logger", "run", "worker", "event", "message"}


@pytest.fixture(scope="module")
def orch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Orchestrator]:
    root = tmp_path_factory.mktemp("operability")
    registry = ProcessRegistry(root)
    env = {
        **NO_RECONCILE,
        "SPOTSWARM_CHECK_IMPORTS": "false",
        "SPOTSWARM_PUBLIC_READS": "false",
        "SPOTSWARM_LOG_FORMAT": "json",
    }
    try:
        yield start_orchestrator(registry, root / "data", extra_env=env)
    finally:
        registry.kill_all()


# -- helpers ------------------------------------------------------------------------------------------


def create(orch: Orchestrator, **overrides: Any) -> tuple[str, str]:
    name = f"ops-{next(_names)}"
    with orch.admin() as http:
        response = http.post("/api/v1/runs", json=run_spec(name, **overrides))
    assert response.status_code == 201, response.text
    return name, response.json()["join_token"]


def launch_intent(orch: Orchestrator, name: str, details: dict[str, Any] | None = None) -> tuple[str, str]:
    """A ``launching`` row of the run's launcher (local), as the reconcile loop writes it: its request id
    and launch token."""
    database = Database(f"sqlite:///{orch.data_dir / 'spotswarm.db'}")
    try:
        with database.begin() as session:
            intent = workers.create_launch_intent(session, runs.get_run(session, name), utc_now(), details)
            return intent.worker.request_id, intent.token
    finally:
        database.close()


@dataclass
class Joined:
    """A worker joined through the real API that reports what a test tells it to."""

    client: OrchestratorClient
    worker_id: str

    def beat(self, **numbers: Any) -> None:
        self.client.heartbeat(self.worker_id, Heartbeat(**numbers))

    def leave(self, reason: DeregisterReason, message: str | None = None) -> None:
        self.client.deregister(self.worker_id, reason, message)


def join(orch: Orchestrator, token: str, request_id: str | None = None) -> Joined:
    client = OrchestratorClient(orch.url, retries=1, backoff_s=0.1)
    registered = client.register(token, WorkerRegister(request_id=request_id, hostname="ops-box"))
    client.token = registered.worker_token
    return Joined(client, registered.worker_id)


def local_worker_with_log(orch: Orchestrator, name: str, text: str) -> tuple[Joined, Path]:
    """A worker of the local launcher (joined with its launch token) and its log, holding ``text``."""
    request_id, launch_token = launch_intent(orch, name)
    worker = join(orch, launch_token, request_id)
    log = orch.data_dir / "workers" / f"{request_id}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(text)
    return worker, log


def admin_get(orch: Orchestrator, path: str, **params: Any) -> Any:
    with orch.admin() as http:
        response = http.get(path, params=params)
    response.raise_for_status()
    return response.json()


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(orch: Orchestrator) -> Samples:
    """Every sample of /metrics by (name, sorted labels)."""
    with orch.admin() as http:
        response = http.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def scrape_until(orch: Orchestrator, ready: Callable[[Samples], bool], timeout_s: float = 15) -> Samples:
    """Scrape until ``ready`` holds for the samples; return them."""
    last: list[Samples] = [{}]

    def check() -> bool:
        last[0] = scrape(orch)
        return ready(last[0])

    wait_until(check, timeout_s, message="metrics caught up")
    return last[0]


# -- metrics ------------------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_metrics_match_the_api_and_vanish_with_the_run(orch: Orchestrator, tmp_path: Path) -> None:
    name, join_token = create(orch, desired_workers=1, stop={"target_samples": TARGET_SAMPLES})
    prices = {"price_usd_per_hour": PRICE_USD_PER_HOUR, "price_per_hour": OTHER_PRICE_PER_HOUR}
    request_id, launch_token = launch_intent(orch, name, prices)
    worker = join(orch, launch_token, request_id)
    numbers = dict(local_step=9, swarm_epoch=4, samples=256, loss=0.25, samples_per_s=32.0, num_peers=1)
    become_checkpointer(orch, {"worker_id": worker.worker_id, "worker_token": worker.client.token}, **numbers)
    checkpoint = tmp_path / "epoch4.ckpt"
    checkpoint.write_bytes(b"weights" * 100)
    worker.client.upload_checkpoint(worker.worker_id, 4, checkpoint)
    with httpx.Client(base_url=orch.url) as anonymous:
        refused = anonymous.post(f"/api/v1/workers/{worker.worker_id}/heartbeat", json={})
        assert refused.status_code == 401
        assert anonymous.get("/metrics").status_code == 401  # reads are not public here
    with orch.client(join_token) as http:
        assert http.get("/metrics").status_code == 403

    samples = scrape_until(orch, lambda s: s.get(("spotswarm_run_samples_total", (("run", name),))) == 256)
    run = admin_get(orch, f"/api/v1/runs/{name}")
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
    assert value(samples, "spotswarm_run_checkpoint_bytes", run=name) == 700
    cost = value(samples, "spotswarm_run_cost_usd", run=name)
    assert 0 < cost < PRICE_USD_PER_HOUR * 120 / 3600  # registered less than two minutes ago
    assert value(samples, "spotswarm_heartbeats_total", result="accepted") >= 1
    assert value(samples, "spotswarm_heartbeats_total", result="rejected") >= 1
    assert value(samples, "spotswarm_dht_up") == 1
    routes = {dict(labels)["route"] for (n, labels) in samples if n.startswith("spotswarm_http_request")}
    assert "/api/v1/workers/{worker_id}/heartbeat" in routes and "/metrics" in routes
    assert not [r for r in routes if re.search(r"/\d+(/|$)", r) or name in r], routes  # templates only

    with orch.admin() as http:
        assert http.post(f"/api/v1/runs/{name}/stop").status_code == 200
    worker.leave(DeregisterReason.stopped)
    wait_until(lambda: admin_get(orch, f"/api/v1/runs/{name}")["state"] == "stopped", 15)
    samples = scrape(orch)
    assert value(samples, "spotswarm_run_state", run=name, state="stopped") == 1
    # The worker has ended, so its cost is fixed: the run view, the worker view and /metrics show the
    # one value the server computed, from price_usd_per_hour.
    run = admin_get(orch, f"/api/v1/runs/{name}")
    (listed,) = admin_get(orch, f"/api/v1/runs/{name}/workers")["items"]
    assert (
        run["cost_usd"]
        == listed["cost_usd"]
        == pytest.approx(value(samples, "spotswarm_run_cost_usd", run=name))
    )
    hours = (parse_time(listed["ended_at"]) - parse_time(listed["registered_at"])).total_seconds() / 3600
    assert run["cost_usd"] == pytest.approx(PRICE_USD_PER_HOUR * hours)
    assert run["eta_s"] is None  # finished
    with orch.admin() as http:
        assert http.delete(f"/api/v1/runs/{name}").status_code == 204
    assert not [key for key in scrape(orch) if ("run", name) in key[1]], "series of a deleted run remain"


# -- the peer list ------------------------------------------------------------------------------------


def maddrs(index: int) -> list[str]:
    """Three addresses of worker ``index``'s peer (a well-formed peer id: a SHA-256 multihash)."""
    peer_id = base58.b58encode(bytes([0x12, 0x20]) + hashlib.sha256(str(index).encode()).digest()).decode()
    return [f"/ip4/10.0.0.{index}/tcp/{4000 + port}/p2p/{peer_id}" for port in range(3)]


@pytest.mark.timeout(120)
def test_run_peers_are_the_orchestrator_then_the_freshest_workers_bounded(orch: Orchestrator) -> None:
    # no training here; admission off so the made-up addresses need no swarm token of their peer ids
    name, join_token = create(orch, max_workers=10, strategy_options={"swarm_admission": False})
    pool = [join(orch, join_token) for _ in range(10)]
    for index, client in enumerate(pool):  # heartbeats in order: the last one is the freshest
        client.beat(visible_maddrs=maddrs(index))

    def peers() -> dict[str, Any]:
        with orch.client(join_token) as http:  # a run's peers also accept its join token
            return dict(http.get(f"/api/v1/runs/{name}/peers").json())

    listed = wait_until(lambda: (p := peers())["worker_peers"][:3] == maddrs(9) and p, 15)
    assert listed["orchestrator_peers"] == admin_get(orch, "/api/v1/peers")["orchestrator_peers"]
    assert listed["initial_peers"] == listed["orchestrator_peers"] + listed["worker_peers"]
    expected = [m for index in range(9, -1, -1) for m in maddrs(index)][:16]  # at most 16 addresses
    assert listed["worker_peers"] == expected

    pool[0].beat(visible_maddrs=maddrs(0))  # worker 0 speaks again: it leads the list
    wait_until(lambda: peers()["worker_peers"][:3] == maddrs(0), 15)
    pool[0].leave(DeregisterReason.stopped)
    wait_until(lambda: not set(maddrs(0)) & set(peers()["worker_peers"]), 15, message="left: unlisted")
    with httpx.Client(base_url=orch.url) as anonymous:
        assert anonymous.get(f"/api/v1/runs/{name}/peers").status_code == 401


# -- worker logs ----------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_worker_log_tail_is_bounded_and_follows_the_read_rule(orch: Orchestrator) -> None:
    name, join_token = create(orch)
    worker, log = local_worker_with_log(
        orch, name, "".join(f"line {i:05d} of the worker's log\n" for i in range(5000))
    )
    path = f"/api/v1/runs/{name}/workers/{worker.worker_id}/log"

    tail = admin_get(orch, path, tail_bytes=100)
    assert tail["size_bytes"] == log.stat().st_size and tail["truncated"]
    assert len(tail["text"].encode()) <= 100 and tail["text"].startswith("line ")
    assert tail["text"].endswith("line 04999 of the worker's log\n")
    assert tail["offset"] + len(tail["text"].encode()) == tail["size_bytes"]
    whole = admin_get(orch, path, tail_bytes=1024 * 1024)
    assert not whole["truncated"] and whole["text"] == log.read_text()

    with orch.admin() as http:
        assert http.get(path, params={"tail_bytes": 1024 * 1024 + 1}).status_code == 422
        assert http.get(path, params={"tail_bytes": 0}).status_code == 422
        assert http.get(f"/api/v1/runs/{name}/workers/999999/log").status_code == 404
        other_name, other_join = create(orch)
        assert http.get(path.replace(name, other_name)).status_code == 404  # not that run's worker
        manual = join(orch, join_token)
        refused = http.get(f"/api/v1/runs/{name}/workers/{manual.worker_id}/log")
        assert refused.status_code == 409 and "by hand" in refused.json()["detail"]
        other_request, other_launch = launch_intent(orch, other_name)
        silent = join(orch, other_launch, other_request)
        missing = http.get(f"/api/v1/runs/{other_name}/workers/{silent.worker_id}/log")
        assert missing.status_code == 404 and "no log" in missing.json()["detail"]
    with httpx.Client(base_url=orch.url) as anonymous:
        assert anonymous.get(path).status_code == 401
    with orch.client(join_token) as http:
        assert http.get(path).status_code == 403

    printed = cli(orch, "runs", "logs", name, "--worker", str(worker.worker_id), "--tail-bytes", "100")
    assert printed.exit_code == 0 and printed.output == tail["text"]
    as_json = cli(orch, "runs", "logs", name, "--worker", str(worker.worker_id), "--json")
    assert json.loads(as_json.output)["size_bytes"] == log.stat().st_size
    assert cli(orch, "runs", "logs", name, "--worker", "1", token="").exit_code == 4


@pytest.mark.timeout(60)
def test_a_worker_log_is_followed_from_its_tail_until_the_worker_ends(
    orch: Orchestrator, tmp_path: Path
) -> None:
    name, _ = create(orch)
    worker, log = local_worker_with_log(orch, name, "".join(f"old {i}\n" for i in range(100)))
    path = f"/api/v1/runs/{name}/workers/{worker.worker_id}/log"
    since = admin_get(orch, path, from_offset=log.stat().st_size - 14, tail_bytes=100)
    assert since["text"] == "old 98\nold 99\n" and since["next_offset"] == log.stat().st_size
    partial = admin_get(orch, path, from_offset=0, tail_bytes=10)  # ends at the last whole line it holds
    assert partial["text"] == "old 0\n" and partial["next_offset"] == 6

    registry = ProcessRegistry(tmp_path)
    args = [
        "runs",
        "logs",
        name,
        "--worker",
        worker.worker_id,
        "-f",
        "--tail-bytes",
        "14",
        "--interval",
        "0.2",
    ]
    env = {"SPOTSWARM_URL": orch.url, "SPOTSWARM_TOKEN": orch.admin_token, "SPOTSWARM_CONFIG": "/absent.toml"}
    try:
        follower = registry.start("follow", [str(VENV_BIN / "spotswarm"), *args], env=env)
        wait_until(lambda: "old 99" in follower.log(), 20, message="the tail is printed")
        with log.open("a") as handle:
            handle.write("new 1\nnew 2 (no line end yet)")
        wait_until(lambda: "new 2" in follower.log(), 20, message="new lines are printed")
        with log.open("a") as handle:
            handle.write(", done\nlast words\n")
        worker.leave(DeregisterReason.completed)
        assert follower.popen.wait(timeout=20) == 0, follower.log()
    finally:
        registry.kill_all()
    assert follower.log() == "old 98\nold 99\nnew 1\nnew 2 (no line end yet), done\nlast words\n"


# -- structured log lines -------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_every_run_event_is_a_json_log_line_with_the_same_fields(orch: Orchestrator) -> None:
    name, join_token = create(orch)
    worker = join(orch, join_token)
    worker.leave(DeregisterReason.error, "out of memory")
    events = admin_get(orch, f"/api/v1/runs/{name}/events")["items"]
    assert {"run.created", "worker.joined", "worker.state"} <= {e["kind"] for e in events}

    def log_lines() -> list[dict[str, Any]]:
        lines = [line for line in orch.proc.log().splitlines() if line.strip()]
        # the admin token is printed once, on purpose, for the operator: the only line not in JSON
        parsed = [json.loads(line) for line in lines if not line.startswith("spotswarm admin token:")]
        assert all(JSON_FIELDS <= set(line) for line in parsed)
        return parsed

    def logged(event: dict[str, Any]) -> bool:
        wanted = (name, event["worker_id"], event["kind"], event["message"])
        return any((x["run"], x["worker"], x["event"], x["message"]) == wanted for x in log_lines())

    wait_until(lambda: all(logged(e) for e in events), 10, message="every event logged")
    levels = {line["level"] for line in log_lines()}
    assert levels <= {"debug", "info", "warning", "error", "critical"} and "info" in levels
