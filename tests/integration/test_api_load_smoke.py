"""bench/api_load.py in miniature (50 workers, a few seconds) against a real orchestrator with the reconcile
loop; the heartbeat fast path answers exactly as the route does; silent hand-joined workers are lost."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from bench.api_load import JOIN_AT_ONCE
from tests.support import api
from tests.support.orchestrator import start_orchestrator
from tests.support.processes import REPO_ROOT, ProcessRegistry
from tests.support.specs import run_spec
from tests.support.waiting import wait_until

ENV = {
    **JOIN_AT_ONCE,
    "SPOTSWARM_CHECK_IMPORTS": "false",
    "SPOTSWARM_RECONCILE": "true",
    "SPOTSWARM_RECONCILE_INTERVAL_S": "0.5",
    "SPOTSWARM_HEARTBEAT_TIMEOUT_S": "4",
}


@pytest.mark.timeout(240)
def test_load_script_runs_and_silent_hand_joined_workers_are_lost(
    processes: ProcessRegistry, tmp_path: Path
) -> None:
    orch = start_orchestrator(processes, tmp_path / "data", extra_env=ENV)
    out = tmp_path / "load.jsonl"
    args = ["--url", orch.url, "--admin-token", orch.admin_token, "--workers", "50", "--interval-s", "1"]
    args += [
        "--warmup-s",
        "1",
        "--duration-s",
        "4",
        "--processes",
        "1",
        "--connections",
        "4",
        "--json",
        str(out),
    ]
    done = subprocess.run(
        [sys.executable, "bench/api_load.py", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads(out.read_text().splitlines()[-1])
    assert figures["errors"] == 0 and figures["requests"] >= 150, figures
    assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]
    assert "p99" in done.stdout and "load average" in done.stdout

    with orch.admin() as http:
        run = http.get(api.runs(), params={"limit": 1}).json()["items"][0]["name"]

        def states() -> list[str]:
            items = http.get(api.run_workers(run), params={"limit": 100}).json()["items"]
            return [w["state"] for w in items]

        assert len(states()) == 50
        wait_until(lambda: set(states()) == {"lost"}, 30, message="silent hand-joined workers are lost")


@pytest.mark.timeout(180)
def test_the_heartbeat_fast_path_answers_as_the_route_does(
    processes: ProcessRegistry, tmp_path: Path
) -> None:
    orch = start_orchestrator(processes, tmp_path / "data", extra_env={**ENV, "SPOTSWARM_RECONCILE": "false"})
    with orch.admin() as http:
        join = http.post(api.runs(), json=run_spec("fast")).json()["join_token"]
    with orch.client(join) as http:
        worker = http.post(api.register(), json={}).json()
    path = api.heartbeat(worker["worker_id"])
    auth = {"Authorization": f"Bearer {worker['worker_token']}"}
    body = b'{"samples": 12, "swarm_epoch": 3, "loss": 0.5}'
    json_type = {"Content-Type": "application/json; charset=utf-8"}
    with httpx.Client(base_url=orch.url, timeout=30) as http:
        # the answers compared must be to the same state: a worker's first heartbeats may come before the
        # cache's next refresh counted it as running and saw it elected checkpointer
        def settled() -> bool:
            reply = http.post(path, content=body, headers={**auth, **json_type}).json()
            return reply["num_workers"] == 1 and reply["checkpointer"] is True

        wait_until(settled, 30, message="the worker is counted as running and is the run's checkpointer")
        fast = http.post(path, content=body, headers={**auth, **json_type})
        # a JSON media type the fast path leaves to the route (FastAPI reads any */*+json as JSON)
        routed = http.post(
            path, content=body, headers={**auth, "Content-Type": "application/vnd.spotswarm+json"}
        )
        assert fast.status_code == routed.status_code == 200 and fast.content == routed.content
        assert fast.headers["content-type"] == routed.headers["content-type"] == "application/json"
        for content_type in ({"Content-Type": "text/plain"}, {}):  # what the fast path leaves alone...
            assert (
                http.post(path, content=body, headers={**auth, **content_type}).status_code == 422
            )  # the route decides
        for headers, content, status in (
            ({}, body, 401),
            ({"Authorization": "Bearer ssw_not-this-workers"}, body, 403),
            (auth, b'{"samples": -1}', 422),
            (auth, b'{"unknown": 1}', 422),
            (auth, b"{", 422),
        ):
            answer = http.post(path, content=content, headers={**headers, "Content-Type": "application/json"})
            assert answer.status_code == status, (headers, content, answer.text)
            assert set(answer.json()) == {"detail"}
        metrics = http.get("/metrics").text
    accepted = [
        line
        for line in metrics.splitlines()
        if line.startswith('spotswarm_heartbeats_total{result="accepted"}')
    ]
    assert accepted and float(accepted[0].split()[-1]) >= 2, accepted
