"""The heartbeat cache (orchestrator/heartbeats/hub.py) against a reload that straddles a registration, on a
fresh SQLite database: the batch writer's thread reloads the cache once a second while requests register
workers, and a reload installs what it read only after the registration put its worker in the cache.

The interleaving is laid out by hand with the reload's two halves (``read``, then ``install``), as the
writer thread does them; the registrations are the real domain calls the route makes.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from orchestrator.config import Settings
from orchestrator.db.models import Run, Worker
from orchestrator.db.session import Database
from orchestrator.domain import runs, workers
from orchestrator.errors import Forbidden
from orchestrator.heartbeats.hub import HeartbeatHub
from worker.protocol.runs import RunSpec, RunState
from worker.protocol.workers import WorkerRegister, WorkerState

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def new_hub(db: Database) -> tuple[HeartbeatHub, int]:
    """A hub on ``db`` with one run, loaded once; the run's id."""
    spec = RunSpec.model_validate(
        {"name": "r", "module": "a.b:C", "datamodule": "a.b:D", "target_batch_size": 64, "batch_size": 8}
    )
    with db.begin() as session:
        run, _ = runs.create_run(session, spec, T0)
        run_id = run.id
    hub = HeartbeatHub(db, Settings(), lambda: T0)
    hub.refresh()
    return hub, run_id


def launch_intent(db: Database, run_id: int) -> tuple[int, str, str]:
    """A launching worker row as the reconciler writes it before a launch: id, request id, launch token."""
    with db.begin() as session:
        run = session.get(Run, run_id)
        assert run is not None
        intent = workers.create_launch_intent(session, run, T0)
        return intent.worker.id, intent.worker.request_id or "", intent.token


def register(db: Database, hub: HeartbeatHub, token: str, request_id: str) -> tuple[int, str]:
    """What the registration route does: write the worker, commit, then note it in the cache."""
    with db.begin() as session:
        reg = workers.register_worker(session, token, WorkerRegister(request_id=request_id), T0)
        cached = hub.entries_of(reg.worker)
    hub.note(cached)
    return reg.worker.id, reg.token


@pytest.mark.timeout(30)
def test_a_reload_that_read_before_a_registration_keeps_the_registered_worker(db: Database) -> None:
    hub, run_id = new_hub(db)
    worker_id, request_id, launch_token = launch_intent(db, run_id)
    hub.refresh()
    read_before = hub.read()  # the writer thread's reload reads ...
    registered_id, worker_token = register(db, hub, launch_token, request_id)  # ... one registers ...
    hub.install(read_before)  # ... and the reload installs what it read

    entry = hub.cached(worker_id)
    assert registered_id == worker_id and entry is not None
    assert entry.state == WorkerState.running
    hub.authenticate(entry, worker_token)  # the first heartbeat after registration is the worker's own
    with pytest.raises(Forbidden):
        hub.authenticate(entry, launch_token)


@pytest.mark.timeout(30)
def test_a_noted_entry_gives_way_to_the_first_reload_that_read_after_it(db: Database) -> None:
    hub, run_id = new_hub(db)
    worker_id, request_id, launch_token = launch_intent(db, run_id)
    register(db, hub, launch_token, request_id)
    with db.begin() as session:  # changed elsewhere (another orchestrator process, the reconciler)
        worker = session.get(Worker, worker_id)
        assert worker is not None
        runs.set_worker_state(session, worker, WorkerState.exited, "exited, written elsewhere", T0)
    hub.refresh()
    assert hub.cached(worker_id) is None  # the database's word counts again: an ended worker leaves the cache


@pytest.mark.timeout(30)
def test_a_reload_that_read_before_a_peer_binding_keeps_the_peer_id(db: Database) -> None:
    hub, run_id = new_hub(db)
    worker_id, request_id, launch_token = launch_intent(db, run_id)
    register(db, hub, launch_token, request_id)
    read_before = hub.read()
    hub.bind_peer(worker_id, "12D3KooWPeer")  # a swarm token was issued meanwhile
    hub.install(read_before)
    entry = hub.cached(worker_id)
    assert entry is not None and entry.peer_id == "12D3KooWPeer"


@pytest.mark.timeout(30)
def test_a_reload_that_read_before_another_reload_does_not_undo_it(db: Database) -> None:
    """The batch writer's reload reads, a use case commits and reloads ("changed"), then the writer's
    reload installs: a full run found a heartbeat reply naming the checkpoint before the one just stored."""
    hub, run_id = new_hub(db)
    _, request_id, launch_token = launch_intent(db, run_id)
    register(db, hub, launch_token, request_id)
    read_before = hub.read()
    with db.begin() as session:
        run = session.get(Run, run_id)
        assert run is not None
        runs.stop_run(session, run, "stopped for the test", T0)
    hub.refresh()
    hub.install(read_before)
    _, cached_runs = hub.snapshot()
    assert cached_runs[run_id].state == RunState.stopping
