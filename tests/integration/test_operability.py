"""Operability against a real `spotswarm serve` (reads need the admin token, logs are JSON lines): a
worker's log tail printed and followed by ``runs logs``, and run events as structured lines of the
server's output. (Metrics, peer lists and the log API: tests/api/, on the app in-process.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support import api
from tests.support.cli import cli
from tests.support.operability import admin_get, create, join, local_worker_with_log
from tests.support.orchestrator import HAND_ONLY, Orchestrator
from tests.support.processes import VENV_BIN, ProcessRegistry
from tests.support.waiting import wait_until
from worker.protocol.workers import DeregisterReason

ORCHESTRATOR_ENV = {**HAND_ONLY, "SPOTSWARM_PUBLIC_READS": "false", "SPOTSWARM_LOG_FORMAT": "json"}
JSON_FIELDS = {"timestamp", "level", "logger", "run", "worker", "event", "message"}


# -- helpers ------------------------------------------------------------------------------------------


# -- worker logs through the CLI ---------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_runs_logs_prints_a_workers_log_tail_and_follows_it_until_the_worker_ends(
    served_orch: Orchestrator, tmp_path: Path
) -> None:
    name, _ = create(served_orch)
    worker, log = local_worker_with_log(served_orch, name, "".join(f"old {i}\n" for i in range(100)))
    path = api.run_worker_log(name, worker.worker_id)
    since = admin_get(served_orch, path, from_offset=log.stat().st_size - 14, tail_bytes=100)
    assert since["text"] == "old 98\nold 99\n" and since["next_offset"] == log.stat().st_size
    partial = admin_get(
        served_orch, path, from_offset=0, tail_bytes=10
    )  # ends at the last whole line it holds
    assert partial["text"] == "old 0\n" and partial["next_offset"] == 6
    tail = admin_get(served_orch, path, tail_bytes=100)
    printed = cli(served_orch, "runs", "logs", name, "--worker", str(worker.worker_id), "--tail-bytes", "100")
    assert printed.exit_code == 0 and printed.output == tail["text"]
    as_json = cli(served_orch, "runs", "logs", name, "--worker", str(worker.worker_id), "--json")
    assert json.loads(as_json.output)["size_bytes"] == log.stat().st_size
    assert cli(served_orch, "runs", "logs", name, "--worker", "1", token="").exit_code == 4

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
    env = {
        "SPOTSWARM_URL": served_orch.url,
        "SPOTSWARM_TOKEN": served_orch.admin_token,
        "SPOTSWARM_CONFIG": "/absent.toml",
    }
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
def test_every_run_event_is_a_json_log_line_with_the_same_fields(served_orch: Orchestrator) -> None:
    name, join_token = create(served_orch)
    worker = join(served_orch, join_token)
    worker.leave(DeregisterReason.error, "out of memory")
    events = admin_get(served_orch, api.run_events(name))["items"]
    assert {"run.created", "worker.joined", "worker.state"} <= {e["kind"] for e in events}

    def log_lines() -> list[dict[str, Any]]:
        lines = [line for line in served_orch.proc.log().splitlines() if line.strip()]
        # the admin token is printed once, on purpose, for the operator: the only line not in JSON
        parsed = [json.loads(line) for line in lines if not line.startswith("spotswarm admin token:")]
        assert all(set(line) >= JSON_FIELDS for line in parsed)
        return parsed

    def logged(event: dict[str, Any]) -> bool:
        wanted = (name, event["worker_id"], event["kind"], event["message"])
        return any((x["run"], x["worker"], x["event"], x["message"]) == wanted for x in log_lines())

    wait_until(lambda: all(logged(e) for e in events), 10, message="every event logged")
    levels = {line["level"] for line in log_lines()}
    assert levels <= {"debug", "info", "warning", "error", "critical"} and "info" in levels
