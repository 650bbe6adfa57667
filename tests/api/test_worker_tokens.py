"""What a join token, a launch token and a worker token may do: the app in-process (the join token's
rotation through the CLI: tests/integration/test_cli_runs.py).

A worker token lives on a worker machine, readable by the user's code; a join token is handed to
whoever starts workers by hand. Each test is an attack that worked before: taking over another
worker's row, failing a run with fake start-up failures, registering without limit, keeping an ended
worker's token or a launch token alive, and the join token's rotation.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from orchestrator.clock import utc_now
from orchestrator.db.session import Database
from orchestrator.domain import runs, workers
from tests.support import api
from tests.support.checkpoint_files import checkpoint_bytes
from tests.support.inprocess import InProcessOrchestrator as Orchestrator
from tests.support.inprocess import inprocess_orchestrator
from tests.support.orchestrator import HAND_ONLY
from tests.support.specs import create_run
from tests.support.waiting import wait_until
from tests.support.workers import become_checkpointer, heartbeat, register, wait_ticks
from worker.agent.boot import register as agent_register
from worker.agent.client import OrchestratorClient
from worker.agent.config import AgentSettings
from worker.protocol.paths import CHECKSUM_HEADER

JOIN_BURST = 6
ORCHESTRATOR_ENV = {**HAND_ONLY, "SPOTSWARM_JOIN_BURST": str(JOIN_BURST), "SPOTSWARM_JOIN_RATE_PER_S": "0.2"}


def create(api_app: Orchestrator, **overrides: Any) -> tuple[str, str]:
    return create_run(api_app, "tl", **overrides)


def post_register(api_app: Orchestrator, token: str, **body: Any) -> Any:
    with api_app.client(token) as http:
        return http.post(api.register(), json={"hostname": "box", **body})


def launch_intent(api_app: Orchestrator, name: str) -> tuple[int, str, str]:
    """Write a launching row as the reconcile loop does: (worker id, request id, launch token)."""
    database = Database(api_app.db_url or f"sqlite:///{api_app.data_dir / 'spotswarm.db'}")
    try:
        with database.begin() as session:
            intent = workers.create_launch_intent(session, runs.get_run(session, name), utc_now())
            return intent.worker.id, intent.worker.request_id, intent.token
    finally:
        database.close()


def worker_row(api_app: Orchestrator, name: str, worker_id: str | int) -> dict[str, Any]:
    with api_app.client() as http:
        items = http.get(api.run_workers(name)).json()["items"]
    return next(w for w in items if w["id"] == str(worker_id))


@pytest.mark.timeout(120)
def test_a_join_token_cannot_rebind_a_running_workers_row(api_app: Orchestrator) -> None:
    """Request ids are public: before, this answered 500 after committing a new token, locking the
    real worker out (its next heartbeat got 403) with the row showing the attacker's hostname."""
    name, join = create(api_app)
    victim = register(api_app, join, hostname="victim")
    request_id = worker_row(api_app, name, victim["worker_id"])["request_id"]
    answer = post_register(api_app, join, request_id=request_id, hostname="attacker")
    assert answer.status_code == 409, answer.text
    assert "join token always joins as a new worker" in answer.json()["detail"]
    assert heartbeat(api_app, victim)["action"] == "continue"
    assert worker_row(api_app, name, victim["worker_id"])["hostname"] == "victim"


@pytest.mark.timeout(120)
def test_a_join_token_cannot_take_a_launching_workers_row(api_app: Orchestrator) -> None:
    """Before, the join token got the launched worker's row (and a worker token) and the real launched
    worker was refused ("unknown launch token") and exited."""
    name, join = create(api_app)
    worker_id, request_id, launch_token = launch_intent(api_app, name)
    answer = post_register(api_app, join, request_id=request_id, hostname="attacker")
    assert answer.status_code == 409, answer.text
    real = register(api_app, launch_token, request_id=request_id, hostname="launched")
    assert real["worker_id"] == str(worker_id)
    assert worker_row(api_app, name, worker_id)["hostname"] == "launched"


@pytest.mark.timeout(120)
def test_a_launch_token_becomes_void_once_the_worker_uses_its_worker_token(api_app: Orchestrator) -> None:
    """The launch token sits in EC2 user data (and the local launcher's environment) for the worker's
    whole life: before, it was the worker token itself. Now registration issues a fresh worker token; a
    registration retried after a lost reply still works until the worker has heartbeated once."""
    name, _ = create(api_app)
    worker_id, request_id, launch_token = launch_intent(api_app, name)
    first = register(api_app, launch_token)
    assert first["worker_id"] == str(worker_id) and first["worker_token"] != launch_token
    retried = register(api_app, launch_token)  # the first reply was lost: the worker asks again
    assert retried["worker_id"] == str(worker_id) and retried["worker_token"] != first["worker_token"]
    with api_app.client(first["worker_token"]) as http:  # the reply that never arrived grants nothing
        assert http.post(api.heartbeat(worker_id), json={}).status_code == 403
    with api_app.client(launch_token) as http:
        assert http.post(api.heartbeat(worker_id), json={}).status_code == 403
    assert heartbeat(api_app, retried, samples=7)["action"] == "continue"  # the worker token is in use now
    wait_until(lambda: worker_row(api_app, name, worker_id)["samples"] == 7, 10, message="heartbeat written")
    answer = post_register(api_app, launch_token)  # so the launch token died with the heartbeat's write
    assert answer.status_code == 401 and "unknown launch token" in answer.json()["detail"], answer.text
    again = register(api_app, retried["worker_token"], request_id=request_id)  # a restarted agent
    assert again["worker_id"] == str(worker_id) and again["worker_token"] == retried["worker_token"]


@pytest.mark.timeout(120)
def test_a_restarted_launched_agent_rejoins_with_its_cached_worker_token(
    api_app: Orchestrator, tmp_path: Path
) -> None:
    """The agent's start-up: the launch token from its environment is void after the first heartbeat,
    so a restarted agent registers again with the worker token it cached and keeps its row."""
    name, _ = create(api_app)
    worker_id, request_id, launch_token = launch_intent(api_app, name)
    config = AgentSettings(
        url=api_app.url, join_token=launch_token, worker_dir=tmp_path / "agent", request_id=request_id
    )
    config.worker_dir.mkdir()
    with OrchestratorClient(api_app.url, retries=0, transport=api_app.transport) as client:
        boot = agent_register(client, config)
        assert boot.registration.worker_id == str(worker_id) and not boot.from_cache
        worker = {"worker_id": boot.registration.worker_id, "worker_token": boot.registration.worker_token}
        heartbeat(api_app, worker, samples=3)
        wait_until(
            lambda: worker_row(api_app, name, worker_id)["samples"] == 3, 10, message="heartbeat written"
        )
        assert post_register(api_app, launch_token).status_code == 401
        restarted = agent_register(client, config)
    assert not restarted.from_cache and restarted.registration.worker_id == str(worker_id)
    assert restarted.registration.worker_token == boot.registration.worker_token
    assert heartbeat(api_app, worker)["action"] == "continue"


@pytest.mark.timeout(120)
def test_an_ended_workers_token_no_longer_downloads_checkpoints(api_app: Orchestrator) -> None:
    """Before, a worker that had left still downloaded the run's model weights with its token."""
    name, join = create(api_app)
    worker = register(api_app, join)
    become_checkpointer(api_app, worker)
    data = checkpoint_bytes(b"weights-v1")
    with api_app.client(worker["worker_token"]) as http:
        headers = {CHECKSUM_HEADER: hashlib.sha256(data).hexdigest()}
        assert http.put(api.checkpoint_upload(worker["worker_id"], 1), content=data, headers=headers)
        downloads = api.run_latest_checkpoint(name)
        assert http.get(downloads).content == data
        left = http.post(api.deregister(worker["worker_id"]), json={"reason": "stopped"})
        assert left.status_code == 204
        answer = http.get(downloads)
    assert answer.status_code == 403 and "has ended" in answer.json()["detail"], answer.text


@pytest.mark.timeout(120)
def test_join_tokens_respect_max_workers(api_app: Orchestrator) -> None:
    """Before, 30 registrations with one join token of a run with max_workers 2 made 30 live workers."""
    _, join = create(api_app, max_workers=2, desired_workers=1)
    first, _ = register(api_app, join), register(api_app, join)
    answer = post_register(api_app, join)
    assert answer.status_code == 409 and "max_workers" in answer.json()["detail"], answer.text
    with api_app.client(first["worker_token"]) as http:
        http.post(api.deregister(first["worker_id"]), json={"reason": "stopped"})
    register(api_app, join)  # a place is free again


@pytest.mark.timeout(120)
def test_registrations_per_join_token_are_rate_limited(api_app: Orchestrator) -> None:
    _, join = create(api_app, max_workers=100)
    _, other_join = create(api_app, max_workers=100)
    for _ in range(JOIN_BURST):
        register(api_app, join)
    answer = post_register(api_app, join)
    assert answer.status_code == 429, answer.text
    assert int(answer.headers["Retry-After"]) >= 1 and "retry" in answer.json()["detail"]
    register(api_app, other_join)  # another run's join token has its own budget


@pytest.mark.timeout(240)
def test_hand_joined_workers_that_fail_do_not_fail_the_run(tmp_path: Path) -> None:
    """Before, six deregistrations with reason "error" from workers joined with the join token counted
    as start-up failures and the reconcile loop failed the run within seconds."""
    env = {"SPOTSWARM_CHECK_IMPORTS": "false", "SPOTSWARM_RECONCILE_INTERVAL_S": "0.3"}
    with inprocess_orchestrator(tmp_path / "data", env=env) as api_app:  # the reconcile loop on
        _failing_hand_joined_workers(api_app)


def _failing_hand_joined_workers(api_app: Orchestrator) -> None:
    name, join = create(api_app, desired_workers=0, min_workers=0, max_workers=10)
    for _ in range(6):
        worker = register(api_app, join)
        with api_app.client(worker["worker_token"]) as http:
            body = {"reason": "error", "message": "made up"}
            assert http.post(api.deregister(worker["worker_id"]), json=body).status_code == 204
    wait_ticks(api_app, 5)
    with api_app.client() as http:
        run = http.get(api.run(name)).json()
    assert run["state"] == "running", run["state_reason"]
