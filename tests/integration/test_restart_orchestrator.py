"""A restarted orchestrator (graceful or killed) keeps its runs, workers, events, token and DHT address."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from tests.support import api
from tests.support.checkpoint_files import checkpoint_bytes
from tests.support.orchestrator import NO_RECONCILE, Orchestrator, start_orchestrator
from tests.support.processes import ProcessRegistry
from tests.support.specs import run_spec
from tests.support.waiting import wait_until
from worker.protocol.paths import CHECKSUM_HEADER

ENV = {**NO_RECONCILE, "SPOTSWARM_CHECK_IMPORTS": "false"}


def snapshot(orch: Orchestrator, name: str) -> dict[str, Any]:
    with orch.client() as http:
        return {
            "run": http.get(api.run(name)).json(),
            "workers": http.get(api.run_workers(name)).json()["items"],
            "events": http.get(api.run_events(name), params={"limit": 1000}).json()["items"],
            "checkpoints": http.get(api.run_checkpoints(name)).json()["items"],
        }


def restart(processes: ProcessRegistry, old: Orchestrator, name: str) -> Orchestrator:
    return start_orchestrator(
        processes, old.data_dir, extra_env=ENV, port=old.port, dht_port=old.dht_port, name=name
    )


@pytest.mark.timeout(300)
def test_state_token_and_dht_address_survive_restarts(processes: ProcessRegistry, tmp_path: Path) -> None:
    first = start_orchestrator(processes, tmp_path / "data", extra_env=ENV)  # admin token generated
    peers = first.peers()
    with first.admin() as http:
        assert http.post(api.runs(), json=run_spec("keep")).status_code == 201
        join = http.post(api.runs(), json=run_spec("keep-2")).json()["join_token"]
    with first.client(join) as http:
        worker = http.post(api.register(), json={"hostname": "h1"}).json()
    auth = {"Authorization": f"Bearer {worker['worker_token']}"}
    with first.client() as http:
        base = f"/api/v1/workers/{worker['worker_id']}"
        http.post(f"{base}/heartbeat", json={"samples": 100, "swarm_epoch": 4, "loss": 0.25}, headers=auth)
        # only the run's checkpointer uploads (one heartbeat: the snapshots below compare its write)
        wait_until(
            lambda: snapshot(first, "keep-2")["run"]["checkpointer_worker_id"] == worker["worker_id"], 10
        )
        data = checkpoint_bytes(b"state" * 100)
        headers = {**auth, CHECKSUM_HEADER: hashlib.sha256(data).hexdigest()}
        assert http.put(f"{base}/checkpoints/4", content=data, headers=headers).status_code == 201
    wait_until(lambda: snapshot(first, "keep-2")["run"]["reported"]["samples_total"] == 100, 10)
    before = snapshot(first, "keep-2")
    assert first.stop() in (0, -15)  # SIGTERM: graceful (uvicorn re-raises the signal once it is done)
    assert "orchestrator stopped" in first.proc.log()

    second = restart(processes, first, "orchestrator-2")
    assert second.admin_token == first.admin_token
    assert second.peers() == peers
    after = snapshot(second, "keep-2")
    assert after["run"]["state"] == "running"
    for key in ("samples_total", "swarm_epoch"):  # (loss and speed count only fresh heartbeats)
        assert after["run"]["reported"][key] == before["run"]["reported"][key]
    assert after["workers"] == before["workers"] and after["checkpoints"] == before["checkpoints"]
    assert [e["id"] for e in after["events"]] == [e["id"] for e in before["events"]]
    with second.client() as http:
        assert http.get(api.run("keep")).json()["state"] == "pending"
        reply = http.post(f"{base}/heartbeat", json={"samples": 150, "swarm_epoch": 5}, headers=auth)
    assert reply.status_code == 200 and reply.json()["action"] == "continue"  # the worker token still works
    assert reply.json()["latest_checkpoint_epoch"] == 4
    wait_until(lambda: snapshot(second, "keep-2")["run"]["reported"]["samples_total"] == 150, 10)
    second.kill()  # a crash: SIGKILL, no shutdown hooks

    third = restart(processes, second, "orchestrator-3")
    assert third.peers() == peers
    crashed = snapshot(third, "keep-2")
    assert crashed["run"]["reported"]["samples_total"] == 150 and len(crashed["events"]) >= len(
        before["events"]
    )
    with third.client(join) as http:
        assert http.get(api.run_latest_checkpoint("keep-2")).content == data
