"""False progress in heartbeats: a worker token (or a join token, which makes one) must not end a run, nor
take the checkpointer role by claiming to be ahead. The stop condition and the checkpointer's lag are
judged by the swarm epoch the orchestrator reads from the DHT; an honest run still completes, also when
its workers leave before the periodic DHT reader saw their last epoch; a completed run resumes.

The orchestrators run without swarm admission so that a plain hivemind peer of the test can publish
progress records the way hivemind's ProgressTracker does.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hivemind
import pytest
from hivemind.utils import get_dht_time

from orchestrator.swarm.dht import progress_key
from tests.support import api
from tests.support.checkpoint_files import checkpoint_bytes
from tests.support.cli import cli
from tests.support.orchestrator import NO_RECONCILE, Orchestrator, start_orchestrator
from tests.support.processes import VENV_BIN, ProcessRegistry
from tests.support.specs import run_spec
from tests.support.waiting import wait_until
from tests.support.workers import become_checkpointer, heartbeat, register, wait_ticks
from worker.protocol.paths import CHECKSUM_HEADER

pytestmark = pytest.mark.swarm
_names = itertools.count()
ORCHESTRATOR_ENV = {
    "SPOTSWARM_CHECK_IMPORTS": "false",
    "SPOTSWARM_SWARM_ADMISSION": "false",
    "SPOTSWARM_RECONCILE_INTERVAL_S": "0.3",
}


class ProgressPeer:
    """A client-mode DHT peer that publishes progress records as hivemind's ProgressTracker does."""

    def __init__(self, orch: Orchestrator) -> None:
        self.dht = hivemind.DHT(
            initial_peers=orch.peers(), host_maddrs=["/ip4/127.0.0.1/tcp/0"], client_mode=True, start=True
        )

    def publish(self, swarm_id: str, epoch: int, peer: str = "honest") -> None:
        value = {"epoch": epoch, "samples_accumulated": 0, "samples_per_second": 10.0, "time": get_dht_time()}
        stored = self.dht.store(
            progress_key(swarm_id),
            subkey=peer,
            value={**value, "client_mode": False},
            expiration_time=get_dht_time() + 120,
        )
        assert stored, "the progress record was not stored"

    def shutdown(self) -> None:
        self.dht.shutdown()


@pytest.fixture
def progress_peer(served_orch: Orchestrator) -> Iterator[ProgressPeer]:
    peer = ProgressPeer(served_orch)
    try:
        yield peer
    finally:
        peer.shutdown()


def create(orch: Orchestrator, **overrides: Any) -> dict[str, Any]:
    spec = run_spec(f"fp-{next(_names)}", desired_workers=0, min_workers=0, max_workers=8, **overrides)
    with orch.admin() as http:
        response = http.post(api.runs(), json=spec)
    assert response.status_code == 201, response.text
    return dict(response.json())


def get_run(orch: Orchestrator, name: str) -> dict[str, Any]:
    with orch.client() as http:
        return dict(http.get(api.run(name)).json())


def leave(orch: Orchestrator, worker: dict[str, Any], reason: str = "completed") -> None:
    with orch.client(worker["worker_token"]) as http:
        answer = http.post(api.deregister(worker["worker_id"]), json={"reason": reason})
    assert answer.status_code == 204, answer.text


@pytest.mark.timeout(180)
def test_a_heartbeat_claiming_the_target_does_not_end_the_run(served_orch: Orchestrator) -> None:
    """Before, one heartbeat claiming swarm_epoch >= target_epochs (or samples >= target_samples)
    completed the run within seconds, for good."""
    run = create(
        served_orch,
        stop={"target_epochs": 100, "target_samples": 10**9},
        strategy_options={"sync": "gradients"},
    )
    liar = register(served_orch, run["join_token"])
    heartbeat(served_orch, liar, swarm_epoch=100, samples=10**12)
    wait_until(
        lambda: get_run(served_orch, run["name"])["reported"]["swarm_epoch"] == 100, 10, message="written"
    )
    wait_ticks(served_orch, 5)
    assert get_run(served_orch, run["name"])["state"] == "running"
    leave(served_orch, liar)  # its leaving reads the DHT afresh: nothing there confirms the claim
    wait_ticks(served_orch, 5)
    state = get_run(served_orch, run["name"])
    assert state["state"] == "running" and state["reported"]["swarm_epoch"] == 100, state


@pytest.mark.timeout(180)
def test_a_false_epoch_does_not_take_the_checkpointer_role(
    served_orch: Orchestrator, progress_peer: ProgressPeer
) -> None:
    """Before, claiming an epoch far ahead made the honest checkpointer "lag" and handed the role (and
    with it checkpoint uploads) to the liar."""
    run = create(served_orch, checkpoint_every_epochs=2)
    honest, liar = register(served_orch, run["join_token"]), register(served_orch, run["join_token"])
    progress_peer.publish(run["swarm_id"], 3)
    become_checkpointer(served_orch, honest, swarm_epoch=3)
    for _ in range(15):  # several flush intervals (0.2 s) and DHT reads (1 s)
        assert not heartbeat(served_orch, liar, swarm_epoch=10**6)["checkpointer"]
        assert heartbeat(served_orch, honest, swarm_epoch=3)["checkpointer"]
        wait_ticks(served_orch, 1)


@pytest.mark.timeout(180)
def test_a_checkpointer_that_falls_behind_the_swarm_hands_the_role_on(
    served_orch: Orchestrator, progress_peer: ProgressPeer
) -> None:
    """A worker still joining (or stuck) must not keep the role while the swarm trains on: behind the
    DHT's epoch by more than checkpoint_every_epochs, it loses it to one that keeps up."""
    run = create(served_orch, checkpoint_every_epochs=2)
    stuck, ahead = register(served_orch, run["join_token"]), register(served_orch, run["join_token"])
    become_checkpointer(served_orch, stuck)
    progress_peer.publish(run["swarm_id"], 2)
    for _ in range(10):  # within 2 epochs: the holder keeps the role
        heartbeat(served_orch, ahead, swarm_epoch=2)
        assert heartbeat(served_orch, stuck, swarm_epoch=0)["checkpointer"]
        wait_ticks(served_orch, 1)
    progress_peer.publish(run["swarm_id"], 4)
    wait_until(
        lambda: (
            heartbeat(served_orch, ahead, swarm_epoch=4)["checkpointer"]
            and not heartbeat(served_orch, stuck, swarm_epoch=0)["checkpointer"]
        ),
        15,
        message="the role moves to the worker that keeps up",
    )


@pytest.mark.timeout(180)
def test_the_dht_epoch_completes_the_run_and_a_completed_run_resumes_with_a_higher_target(
    served_orch: Orchestrator, progress_peer: ProgressPeer, processes: ProcessRegistry
) -> None:
    run = create(
        served_orch,
        stop={"target_samples": 1000},
        target_batch_size=64,
        checkpoint_every_epochs=4,
        strategy_options={"sync": "gradients"},
    )
    watch = [str(VENV_BIN / "spotswarm"), "runs", "watch", run["name"], "--interval", "0.2"]
    watcher = processes.start("watch", [*watch, "--url", served_orch.url, "--token", served_orch.admin_token])
    worker = register(served_orch, run["join_token"])
    progress_peer.publish(run["swarm_id"], 15)  # 15 x 64 = 960 samples: short of the target
    heartbeat(served_orch, worker, swarm_epoch=15, samples=10**12)
    wait_until(lambda: get_run(served_orch, run["name"])["swarm"] is not None, 15, message="the DHT is read")
    wait_ticks(served_orch, 5)
    assert get_run(served_orch, run["name"])["state"] == "running"
    become_checkpointer(served_orch, worker, swarm_epoch=16)
    final = checkpoint_bytes(b"state at epoch 16")
    headers = {CHECKSUM_HEADER: hashlib.sha256(final).hexdigest()}
    with served_orch.client(worker["worker_token"]) as http:
        path = api.checkpoint_upload(worker["worker_id"], 16)
        assert http.put(path, content=final, headers=headers).status_code == 201
    progress_peer.publish(run["swarm_id"], 16)  # 1024 samples
    wait_until(lambda: heartbeat(served_orch, worker, swarm_epoch=16)["action"] == "stop", 15, message="stop")
    leave(served_orch, worker)
    done = wait_until(lambda: (r := get_run(served_orch, run["name"]))["state"] == "completed" and r, 15)
    assert done["state_reason"] == "all workers have left"
    assert watcher.popen.wait(timeout=20) == 0, watcher.log()  # `runs watch` exits 0 on completion
    assert "state completed" in watcher.log().splitlines()[-1], watcher.log()

    same = cli(served_orch, "runs", "resume", run["name"])
    assert same.exit_code == 6 and "reached its stop condition" in same.output, same.output
    raised = cli(served_orch, "runs", "resume", run["name"], "--target-samples", "2000")
    assert raised.exit_code == 0, raised.output
    resumed = get_run(served_orch, run["name"])
    assert resumed["state"] == "pending" and resumed["spec"]["stop"]["target_samples"] == 2000


@pytest.mark.timeout(180)
def test_an_epoch_published_just_before_the_last_worker_leaves_completes_the_run(
    processes: ProcessRegistry, tmp_path: Path
) -> None:
    """The periodic DHT reader (here once a minute) need not have seen the last epoch: a worker's leaving
    reads its run's progress afresh while the worker's DHT peer is still up, and the heartbeat it sent
    last is written first."""
    env = {
        **ORCHESTRATOR_ENV,
        **NO_RECONCILE,
        "SPOTSWARM_DHT_REFRESH_INTERVAL_S": "60",
        "SPOTSWARM_HEARTBEAT_FLUSH_INTERVAL_S": "60",
    }
    orch = start_orchestrator(processes, tmp_path / "data", extra_env=env)
    run = create(orch, stop={"target_epochs": 3})
    worker = register(orch, run["join_token"])
    peer = ProgressPeer(orch)
    try:
        with orch.admin() as http:
            assert http.post(api.run_stop(run["name"])).json()["state"] == "stopping"
        peer.publish(run["swarm_id"], 3)
        heartbeat(orch, worker, swarm_epoch=3)  # answered from memory, written at the next flush
        leave(orch, worker)
    finally:
        peer.shutdown()
    done = get_run(orch, run["name"])
    assert done["state"] == "completed" and done["reported"]["swarm_epoch"] == 3, done
