"""Machines of several peers (``launcher_options.peers_per_machine``): the reconcile loop on a fresh SQLite
database with the local launcher, whose workers are a tiny script that records its environment and sleeps.

The loop launches whole machines of ``min(peers_per_machine, peers missing)``, one worker row, request id
and token per peer; never launches more while they start; re-forms a machine an earlier process wrote
but never launched; and a peer ended alone (scale-down) leaves its siblings running. Each peer gets
cores of its own with ``cpus_per_worker``, and a bad ``peers_per_machine`` is a 422 at the run's creation.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from orchestrator.db.models import Worker
from orchestrator.db.session import Database
from orchestrator.launchers.base import Instance, LaunchRequest, PeerRequest
from orchestrator.launchers.local import LocalLauncher
from orchestrator.launchers.local_cpus import usable_cpus
from orchestrator.reconciler.loop import Reconciler
from orchestrator.reconciler.policy import ReconcileSettings
from tests.support import api
from tests.support.inprocess import inprocess_orchestrator
from tests.support.orchestrator import HAND_ONLY
from tests.support.specs import run_spec
from tests.support.waiting import wait_until
from tests.unit.test_runs_lifecycle import new_run
from worker.protocol.workers import WorkerState

SLEEPER = textwrap.dedent(
    """
    import json, os, time
    keep = {k: v for k, v in os.environ.items() if k.startswith("SPOTSWARM_")}
    path = os.path.join(os.environ["SPOTSWARM_WORKER_DIR"], "env.json")
    with open(path + ".part", "w") as f:  # renamed once whole: the test reads it as soon as it exists
        json.dump(keep, f)
    os.rename(path + ".part", path)
    time.sleep(600)
    """
)


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[LocalLauncher]:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    launcher = LocalLauncher(tmp_path / "data", [sys.executable, str(script)], cwd=tmp_path, grace_s=1.0)
    try:
        yield launcher
    finally:
        for instance in launcher.describe():
            launcher.terminate(instance.request_id)
        wait_until(lambda: not any(i.alive for i in launcher.describe()), 10, message="workers gone")
        launcher.close()


def reconciler(db: Database, launcher: LocalLauncher) -> Reconciler:
    settings = ReconcileSettings(launch_timeout_s=600)
    return Reconciler(db, {"local": launcher}, "http://127.0.0.1:9", settings, lambda: datetime.now(UTC))


def rows(db: Database) -> list[tuple[str, WorkerState, dict[str, object]]]:
    with db.begin() as session:
        found = session.scalars(select(Worker).order_by(Worker.id))
        return [(w.request_id, w.state, dict(w.launch_details)) for w in found]


def alive(launcher: LocalLauncher) -> dict[str, Instance]:
    return {i.request_id: i for i in launcher.describe() if i.alive}


def worker_env(tmp_path: Path, request_id: str) -> dict[str, str]:
    path = tmp_path / "data" / "workers" / request_id / "env.json"
    wait_until(path.exists, 15, message=f"worker {request_id} started")
    env: dict[str, str] = json.loads(path.read_text())
    return env


@pytest.mark.timeout(60)
def test_peers_launch_as_whole_machines_each_its_own_worker_and_none_more_while_they_start(
    tmp_path: Path, db: Database, launcher: LocalLauncher
) -> None:
    new_run(db, desired_workers=3, launcher_options={"peers_per_machine": 2})
    loop = reconciler(db, launcher)

    assert loop.tick().launched == 3

    written = rows(db)
    assert [state for _, state, _ in written] == [WorkerState.launching] * 3
    (first, _, first_details), (second, _, second_details), (third, _, third_details) = written
    assert first_details == {"machine": first, "peer_index": 0}
    assert second_details == {"machine": first, "peer_index": 1}
    assert "machine" not in third_details, "the last machine holds the one peer still missing"
    instances = wait_until(lambda: len(found := alive(launcher)) == 3 and found, 15, message="3 workers up")
    assert instances[second].details["machine"] == first and instances[second].details["peer_index"] == 1
    envs = [worker_env(tmp_path, request_id) for request_id, _, _ in written]
    assert [env["SPOTSWARM_REQUEST_ID"] for env in envs] == [first, second, third]
    assert len({env["SPOTSWARM_JOIN_TOKEN"] for env in envs}) == 3, "a token of its own per peer"

    for _ in range(2):
        assert loop.tick().launched == 0, "peers still starting count: no machine more"
    assert len(rows(db)) == 3

    # A peer ended alone (its retire grace over) leaves its sibling on the machine running.
    launcher.terminate(second)
    wait_until(lambda: second not in alive(launcher), 10, message="the retired peer ended")
    assert first in alive(launcher)


@pytest.mark.timeout(60)
def test_a_machine_written_but_never_launched_is_launched_whole_by_the_next_process(
    db: Database, launcher: LocalLauncher
) -> None:
    new_run(db, desired_workers=2, launcher_options={"peers_per_machine": 2})
    crashed = reconciler(db, launcher)
    crashed._decide({}, {})  # the intents are committed, then the process dies before launching
    assert not launcher.describe()
    (first, _, _), (second, _, _) = rows(db)

    assert reconciler(db, launcher).tick().launched == 2

    instances = wait_until(lambda: len(found := alive(launcher)) == 2 and found, 15, message="2 workers up")
    assert instances[second].details["machine"] == first
    assert [r[1] for r in rows(db)] == [WorkerState.launching] * 2


@pytest.mark.timeout(60)
def test_each_peer_of_a_machine_gets_cores_of_its_own(tmp_path: Path, launcher: LocalLauncher) -> None:
    cores = usable_cpus()
    assert len(cores) >= 2, "this test needs a machine with two cores"
    options = {"peers_per_machine": 2, "cpus_per_worker": 1}
    siblings = (PeerRequest("req-b", {"SPOTSWARM_REQUEST_ID": "req-b"}),)
    launcher.launch(LaunchRequest("req-a", "demo", {"SPOTSWARM_REQUEST_ID": "req-a"}, options, siblings))

    assert [worker_env(tmp_path, rid)["SPOTSWARM_CPUS"] for rid in ("req-a", "req-b")] == [
        str(cores[0]),
        str(cores[1]),
    ]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "peers_per_machine must be a whole number from 1 to 64"),
        ("2", "peers_per_machine must be a whole number from 1 to 64"),
        (65, "peers_per_machine must be a whole number from 1 to 64"),
    ],
)
def test_a_bad_peers_per_machine_is_refused_when_the_run_is_created(
    tmp_path: Path, launcher: LocalLauncher, value: object, message: str
) -> None:
    spec = run_spec("bad-peers", launcher_options={"peers_per_machine": value})
    app = inprocess_orchestrator(tmp_path / "orch", env=HAND_ONLY, launchers={"local": launcher})
    with app as orch, orch.admin() as http:
        response = http.post(api.runs(), json=spec)
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith(f"launcher_options: {message} "), response.text
