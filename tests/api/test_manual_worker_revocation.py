"""A hand-joined worker's token does not outlive its silence nor the admin's revocation (security review
N5): the reconcile loop ends a worker joined by hand that stays silent past ``manual_lost_end_s``, and
``POST /runs/{name}/manual-workers/revoke`` ends every one at once; either way its worker token stops
working, while launched workers go on."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from tests.support import api
from tests.support.checkpoint_files import checkpoint_bytes
from tests.support.inprocess import InProcessOrchestrator as Orchestrator
from tests.support.inprocess import inprocess_orchestrator
from tests.support.operability import launch_intent
from tests.support.specs import create_run
from tests.support.waiting import wait_until
from tests.support.workers import become_checkpointer, heartbeat, register
from worker.protocol.paths import CHECKSUM_HEADER

LOOP = {
    "SPOTSWARM_CHECK_IMPORTS": "false",
    "SPOTSWARM_RECONCILE_INTERVAL_S": "0.3",
    "SPOTSWARM_HEARTBEAT_TIMEOUT_S": "1",
    "SPOTSWARM_MANUAL_LOST_END_S": "3",
}


def state_of(api_app: Orchestrator, name: str, worker: dict[str, Any]) -> str:
    with api_app.client() as http:
        rows = http.get(api.run_workers(name)).json()["items"]
    return str(next(w["state"] for w in rows if w["id"] == worker["worker_id"]))


def download_status(api_app: Orchestrator, name: str, token: str) -> int:
    with api_app.client(token) as http:
        return http.get(api.run_latest_checkpoint(name)).status_code


def stored_checkpoint(api_app: Orchestrator, worker: dict[str, Any]) -> None:
    become_checkpointer(api_app, worker)
    data = checkpoint_bytes(b"weights")
    with api_app.client(worker["worker_token"]) as http:
        headers = {CHECKSUM_HEADER: hashlib.sha256(data).hexdigest()}
        path = api.checkpoint_upload(worker["worker_id"], 1)
        assert http.put(path, content=data, headers=headers).status_code == 201


@pytest.mark.timeout(120)
def test_a_silent_hand_joined_workers_token_stops_working_after_the_bound(tmp_path: Path) -> None:
    """Before, a silent hand-joined worker stayed lost as long as its run lived: its token kept
    downloading checkpoints and re-registering (secret_env included), after a join-token rotation too."""
    with inprocess_orchestrator(tmp_path / "data", env=LOOP) as api_app:  # the reconcile loop on
        name, join = create_run(api_app, "silent", desired_workers=0, min_workers=0)
        hand = register(api_app, join)
        stored_checkpoint(api_app, hand)
        with api_app.admin() as http:
            http.post(api.run_join_token(name)).raise_for_status()
        wait_until(lambda: state_of(api_app, name, hand) == "lost", 30, message="the silent worker is lost")
        assert download_status(api_app, name, hand["worker_token"]) == 200  # lost is not ended: it may return
        wait_until(lambda: state_of(api_app, name, hand) == "exited", 30, message="the lost worker has ended")
        assert download_status(api_app, name, hand["worker_token"]) == 403
        with api_app.client(hand["worker_token"]) as http:
            again = http.post(api.register(), json={"hostname": "box"})
        assert again.status_code == 409 and "ended" in again.json()["detail"], again.text
        # the heartbeat cache learns of the change at its next reload (a flush interval)
        wait_until(lambda: heartbeat(api_app, hand)["action"] == "stop", 10, message="heartbeats answer stop")


@pytest.mark.timeout(120)
def test_revoking_hand_joined_workers_ends_them_and_keeps_launched_ones(api_app: Orchestrator) -> None:
    name, join = create_run(api_app, "revoke")
    first, second = register(api_app, join), register(api_app, join)
    stored_checkpoint(api_app, first)
    request_id, launch_token = launch_intent(api_app, name)
    launched = register(api_app, launch_token, request_id=request_id)
    path = api.run_revoke_manual(name)
    with api_app.client(join) as http:
        assert http.post(path).status_code == 403
    with api_app.admin() as http:
        answer = http.post(path)
    assert answer.status_code == 200, answer.text
    assert sorted(answer.json()["revoked"]) == sorted([first["worker_id"], second["worker_id"]])
    for hand in (first, second):
        assert download_status(api_app, name, hand["worker_token"]) == 403
        assert heartbeat(api_app, hand)["action"] == "stop"
        assert state_of(api_app, name, hand) == "exited"
    assert download_status(api_app, name, launched["worker_token"]) == 200
    assert heartbeat(api_app, launched)["action"] == "continue"
    with api_app.client() as http:
        events = http.get(api.run_events(name)).json()["items"]
    revoked = f"workers joined by hand revoked: {first['worker_id']}, {second['worker_id']}"
    assert revoked in [e["message"] for e in events if e["kind"] == "run.revoked"]
    with api_app.admin() as http:  # nothing left to revoke: an empty answer, no error
        assert http.post(path).json()["revoked"] == []
