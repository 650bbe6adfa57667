"""Database faults: the orchestrator killed (-9) in the middle of heavy writes on SQLite, and PostgreSQL
restarted under a running orchestrator.

"Committed", as a client can know it: a request whose answer was 2xx and whose handler writes in a
transaction that commits before the answer is sent (create, scale, register, deregister, upload). A
heartbeat is not committed by its 200: it is buffered and written by the next batch flush, so a crash may
lose the heartbeats of the last flush interval (the next heartbeat repairs them); the test bounds that.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from orchestrator.db.models import Run
from orchestrator.db.session import Database
from tests.support import api
from tests.support.orchestrator import NO_RECONCILE, Orchestrator, start_orchestrator
from tests.support.postgres import PostgresCluster
from tests.support.processes import ProcessRegistry
from tests.support.specs import run_spec
from tests.support.waiting import wait_until

ENV = {**NO_RECONCILE, "SPOTSWARM_CHECK_IMPORTS": "false", "SPOTSWARM_HEARTBEAT_FLUSH_INTERVAL_S": "0.2"}
#: heartbeats answered before the kill, so that the kill falls on a loaded database
MIN_HEARTBEATS = 100
FLUSH_SLACK_S = 2.0  # a flush interval (0.2 s) plus a slow flush on a busy machine


@dataclass
class Acked:
    """What the orchestrator answered 2xx to, with the time of each answer (monotonic)."""

    runs: list[str] = field(default_factory=list)
    desired: dict[str, int] = field(default_factory=dict)  # run -> last acknowledged desired_workers
    workers: dict[str, str] = field(default_factory=dict)  # worker id -> run
    heartbeats: dict[str, list[tuple[float, int]]] = field(default_factory=dict)  # id -> (time, samples)
    #: id -> the samples of its last heartbeat sent, answered or not (the kill can cut off the answer to
    #: one the server wrote)
    sent: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def heartbeat_count(self) -> int:
        with self.lock:
            return sum(len(beats) for beats in self.heartbeats.values())


def _admin_writer(orch: Orchestrator, acked: Acked, stop: threading.Event) -> None:
    """Creates runs, registers a worker in each and scales them, one request after another."""
    with orch.admin() as http:
        for index in range(10_000):
            if stop.is_set():
                return
            name = f"crash-{index}"
            try:
                created = http.post(api.runs(), json=run_spec(name, desired_workers=1))
                if created.status_code != 201:
                    return
                acked.runs.append(name)
                scaled = http.post(api.run_scale(name), json={"desired_workers": 2})
                if scaled.status_code == 200:
                    acked.desired[name] = 2
                join = created.json()["join_token"]
                joined = http.post(
                    api.register(),
                    json={"hostname": "w"},
                    headers={"Authorization": f"Bearer {join}"},
                )
                if joined.status_code == 200:
                    with acked.lock:
                        acked.workers[joined.json()["worker_id"]] = name
                        acked.heartbeats[joined.json()["worker_id"]] = []
                    _start_heartbeats(orch, joined.json(), acked, stop)
            except httpx.HTTPError:
                return


def _start_heartbeats(orch: Orchestrator, reply: dict[str, str], acked: Acked, stop: threading.Event) -> None:
    def beat() -> None:
        path = api.heartbeat(reply["worker_id"])
        with orch.client(reply["worker_token"], timeout_s=10) as http:
            for samples in range(1, 1_000_000):
                if stop.is_set():
                    return
                acked.sent[reply["worker_id"]] = samples
                try:
                    answer = http.post(path, json={"samples": samples, "swarm_epoch": samples // 10})
                except httpx.HTTPError:
                    return
                if answer.status_code == 200:
                    acked.heartbeats[reply["worker_id"]].append((time.monotonic(), samples))

    threading.Thread(target=beat, daemon=True).start()


def _read_db(path: Path) -> tuple[str, dict[str, int], set[str], dict[str, int]]:
    """Integrity check result, desired counts by run, worker ids, samples by worker id."""
    with sqlite3.connect(path) as db:
        integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
        desired = dict(db.execute("SELECT name, desired_workers FROM runs").fetchall())
        workers = {str(row[0]): int(row[1]) for row in db.execute("SELECT id, samples FROM workers")}
    return integrity, desired, set(workers), workers


@pytest.mark.timeout(300)
def test_sqlite_kill_during_heavy_writes_loses_no_committed_row(
    processes: ProcessRegistry, tmp_path: Path
) -> None:
    orch = start_orchestrator(processes, tmp_path / "data", extra_env=ENV)
    acked, stop = Acked(), threading.Event()
    writers = [threading.Thread(target=_admin_writer, args=(orch, acked, stop), daemon=True)]
    for writer in writers:
        writer.start()
    # the kill comes under load: on a busy machine eight workers can register before many beats are sent
    wait_until(
        lambda: len(acked.workers) >= 8 and acked.heartbeat_count() > MIN_HEARTBEATS,
        120,
        message=f"eight workers heartbeating, over {MIN_HEARTBEATS} heartbeats answered",
    )
    orch.kill()  # kill -9 of the server and its DHT daemon
    killed_at = time.monotonic()
    stop.set()
    for writer in writers:
        writer.join(timeout=30)

    integrity, desired, stored_workers, samples = _read_db(tmp_path / "data" / "spotswarm.db")
    assert integrity == "ok"
    assert set(acked.runs) <= set(desired), set(acked.runs) - set(desired)
    assert all(desired[name] == value for name, value in acked.desired.items())
    assert set(acked.workers) <= stored_workers, set(acked.workers) - stored_workers
    for worker_id, beats in acked.heartbeats.items():
        answered_before = [s for t, s in beats if t <= killed_at - FLUSH_SLACK_S]
        if answered_before:
            assert samples[worker_id] >= max(answered_before), (worker_id, samples[worker_id], beats[-3:])
        assert samples[worker_id] <= acked.sent.get(worker_id, 0), "a heartbeat nobody sent"

    database = Database(f"sqlite:///{tmp_path / 'data' / 'spotswarm.db'}")  # as the server opens it
    try:
        database.upgrade()  # the schema is at head: nothing to repair
        with database.read() as session:
            assert set(acked.runs) <= set(session.scalars(select(Run.name)))
    finally:
        database.close()


def _during_outage(orch: Orchestrator, name: str, worker: dict[str, str]) -> dict[str, int]:
    """One of each kind of request while the database is down: name -> status (and each is quick)."""
    auth = {"Authorization": f"Bearer {worker['worker_token']}"}
    answers: dict[str, int] = {}
    with orch.admin() as http:
        calls = {
            "readyz": lambda: http.get("/readyz"),
            "list runs": lambda: http.get(api.runs()),
            "get run": lambda: http.get(api.run(name)),
            "events": lambda: http.get(api.run_events(name)),
            "create run": lambda: http.post(api.runs(), json=run_spec(f"{name}-during")),
            "scale": lambda: http.post(api.run_scale(name), json={"desired_workers": 0}),
            "heartbeat": lambda: http.post(
                api.heartbeat(worker["worker_id"]), json={"samples": 500}, headers=auth
            ),
            "metrics": lambda: http.get("/metrics"),
        }
        for what, call in calls.items():
            started = time.monotonic()
            answers[what] = call().status_code
            assert time.monotonic() - started < 25, f"{what} hung during the outage"
    return answers


@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_postgres_restart_gives_503_then_recovers(
    processes: ProcessRegistry, tmp_path: Path, own_postgres_cluster: PostgresCluster
) -> None:
    url = own_postgres_cluster.create_database("outage")
    orch = start_orchestrator(processes, tmp_path / "data", url, extra_env=ENV)
    name = "outage"
    with orch.admin() as http:
        join = http.post(api.runs(), json=run_spec(name)).json()["join_token"]
    with orch.client(join) as http:
        worker = http.post(api.register(), json={"hostname": "w"}).json()

    own_postgres_cluster.stop_server()
    outage = _during_outage(orch, name, worker)
    with orch.client(join) as http:  # a joining worker is told when to come back, and retries then
        refused = http.post(api.register(), json={"hostname": "w2"})
    assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1, refused.headers
    assert outage.pop("heartbeat") == 200, "heartbeats are answered from memory while the database is away"
    assert outage.pop("metrics") == 200  # per-run values are left out while the database is away
    assert set(outage.values()) == {503}, outage
    own_postgres_cluster.start_server()

    wait_until(lambda: httpx.get(f"{orch.url}/readyz", timeout=10).status_code == 200, 60, message="ready")
    with orch.admin() as http:
        assert http.post(api.runs(), json=run_spec(f"{name}-after")).status_code == 201
        assert http.post(api.run_scale(name), json={"desired_workers": 2}).status_code == 200

        def heartbeat_written() -> bool:
            workers = http.get(api.run_workers(name)).json()["items"]
            return bool(workers[0]["samples"] == 500)

        wait_until(heartbeat_written, 30, message="the heartbeat buffered during the outage is written")
    assert orch.proc.alive()
    assert "internal server error" not in orch.proc.log().lower()
    assert "unexpected error" not in orch.proc.log()
