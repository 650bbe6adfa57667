"""Helpers of the tests that act as workers over the API (a server in a subprocess or in-process):
register, heartbeat, become the checkpointer, get a swarm token (whose peer id the worker's announced
addresses must carry), count reconcile ticks (to wait for the loop to have judged a run several
times), and mark a worker lost on the server's database as the reconcile loop does."""

from __future__ import annotations

from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric import rsa

from orchestrator.clock import utc_now
from orchestrator.db.models import Worker
from orchestrator.db.session import Database
from orchestrator.domain import runs
from tests.support import api
from tests.support.orchestrator import ApiServer
from tests.support.waiting import wait_until
from worker.admission.tokens import openssh_public_key
from worker.protocol.workers import WorkerState


def register(orch: ApiServer, token: str, **body: Any) -> dict[str, Any]:
    """Register with ``token`` (join, launch or worker token); asserts a 200 and returns the reply."""
    with orch.client(token) as http:
        response = http.post(api.register(), json={"hostname": "box", **body})
    assert response.status_code == 200, response.text
    return dict(response.json())


def ask_token(orch: ApiServer, worker_id: str, token: str | None, public_key: str) -> httpx.Response:
    """Ask for a swarm token for ``worker_id``'s peer with ``token``; the answer as it is."""
    with orch.client(token) as http:
        return http.post(api.swarm_token(worker_id), json={"public_key": public_key})


def heartbeat(orch: ApiServer, worker: dict[str, Any], **body: Any) -> dict[str, Any]:
    """One heartbeat of ``worker`` (a registration reply); asserts a 200 and returns the reply."""
    with orch.client(worker["worker_token"]) as http:
        response = http.post(api.heartbeat(worker["worker_id"]), json=body)
    assert response.status_code == 200, response.text
    return dict(response.json())


def become_checkpointer(orch: ApiServer, worker: dict[str, Any], timeout_s: float = 15, **body: Any) -> None:
    """Heartbeat until the orchestrator names ``worker`` the run's checkpointer (only it may upload)."""
    wait_until(
        lambda: heartbeat(orch, worker, **body)["checkpointer"],
        timeout_s,
        message=f"worker {worker['worker_id']} is the checkpointer",
    )


def new_public_key() -> str:
    """A fresh RSA-2048 public key, OpenSSH format (a peer's identity)."""
    return openssh_public_key(rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key())


def swarm_token_peer_id(orch: ApiServer, worker: dict[str, Any]) -> str:
    """Ask for the worker's swarm token (as its agent does before starting its DHT); its peer id."""
    with orch.client(worker["worker_token"]) as http:
        answer = http.post(api.swarm_token(worker["worker_id"]), json={"public_key": new_public_key()})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["peer_id"])


def reconcile_ticks(orch: ApiServer) -> float:
    """How many ticks the reconcile loop has made (from ``/metrics``)."""
    with orch.client() as http:
        text = http.get("/metrics").text
    line = next(line for line in text.splitlines() if line.startswith("spotswarm_reconcile_ticks_total"))
    return float(line.split()[-1])


def wait_ticks(orch: ApiServer, ticks: int, timeout_s: float = 60) -> None:
    """Wait until the reconcile loop has ticked ``ticks`` more times."""
    start = reconcile_ticks(orch)
    wait_until(lambda: reconcile_ticks(orch) >= start + ticks, timeout_s, message=f"{ticks} reconcile ticks")


def mark_lost(orch: ApiServer, worker_id: str, reason: str) -> None:
    """Move the worker to ``lost`` on ``orch``'s database with ``reason``, through the function the
    reconcile loop calls when a worker's heartbeats stop (for servers that run no loop: joins by hand)."""
    database = Database(orch.database_url())
    try:
        with database.begin() as session:
            worker = session.get(Worker, int(worker_id))
            assert worker is not None, f"no worker {worker_id}"
            runs.set_worker_state(session, worker, WorkerState.lost, reason, utc_now())
    finally:
        database.close()
