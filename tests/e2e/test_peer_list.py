"""The peer list keeps a swarm whole while the orchestrator is down.

Two workers train through the reconcile loop and keep the run's peer list in their worker dirs
(``peers.json``). The run admits peers by swarm token (the default): its user registers a third worker
with the run's join token while the orchestrator is up, and that worker fetches and caches its swarm
token. The orchestrator is killed; the third worker, started by hand with the saved list and its cached
token (plain Lightning + HivemindStrategy, no orchestrator), joins the same swarm: the DHT shows three
peers in step (at most one epoch apart), read by a monitoring peer that signs its own token with the
authority key in the orchestrator's data dir. The orchestrator comes back and the two workers
re-attach, reporting three peers."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import hivemind
import pytest

from tests.support import api
from tests.support.dht_reads import read_latest
from tests.support.monitor_peer import monitor_dht
from tests.support.orchestrator import Orchestrator
from tests.support.processes import ProcessRegistry
from tests.support.runs import GRADIENTS, RunReader, admin_post, digits_run, start_loop_orchestrator
from tests.support.waiting import BOOT_S, wait_until
from worker.admission.authorizer import SwarmAuthorizer
from worker.agent.client import OrchestratorClient
from worker.agent.token_cache import CachingTokenSource, ClientTokenSource, identity_path

pytestmark = [pytest.mark.swarm]
RUN = "whole"
TARGET_BATCH_SIZE = 64
ENV = {
    "SPOTSWARM_CHECK_IMPORTS": "false",
    "SPOTSWARM_PEERS_REFRESH_S": "1",  # inherited by the local workers: their peers.json stays fresh
}


def peer_id(maddr: str) -> str:
    return maddr.rsplit("/p2p/", 1)[-1]


def saved_peers(data_dir: Path, worker: dict[str, Any]) -> list[str]:
    """The list the agent keeps in its worker dir (the local launcher's layout)."""
    path = data_dir / "workers" / worker["request_id"] / "peers.json"
    return list(json.loads(path.read_text())["initial_peers"]) if path.exists() else []


def register_by_hand(orch: Orchestrator, join_token: str, swarm_id: str, worker_dir: Path) -> Path:
    """What a user does before starting a worker by hand: register it with the run's join token and
    fetch its swarm token (cached in ``worker_dir`` with its identity). Returns the worker's JSON."""
    with orch.client(join_token) as http:
        response = http.post(api.register(), json={"hostname": "by-hand"})
        registration = response.raise_for_status().json()
    worker_id, token = registration["worker_id"], registration["worker_token"]
    fetch = ClientTokenSource(lambda: OrchestratorClient(orch.url, token), worker_id)
    SwarmAuthorizer.create(
        swarm_id, CachingTokenSource(fetch, worker_dir, worker_id), identity_path(worker_dir, worker_id)
    )
    described = worker_dir / "worker.json"
    worker = {"url": orch.url, "worker_id": worker_id, "worker_token": token, "worker_dir": str(worker_dir)}
    described.write_text(json.dumps(worker))
    return described


def swarm_epochs(reader: hivemind.DHT, swarm_id: str) -> list[int]:
    """Epoch of every training peer publishing progress for ``swarm_id`` (hivemind's ProgressTracker key)."""
    found = read_latest(reader, f"{swarm_id}_progress", attempts=1)  # polled: the next poll asks again
    entries = found.value.values() if found is not None and isinstance(found.value, dict) else []
    values = [e.value for e in entries if isinstance(e.value, dict) and not e.value.get("client_mode")]
    return [int(v["epoch"]) for v in values]


@pytest.mark.timeout(420)
def test_saved_peer_list_joins_a_hand_started_worker_while_the_orchestrator_is_down(
    processes: ProcessRegistry, loop_data_dir: Path, tmp_path: Path
) -> None:
    orch = start_loop_orchestrator(processes, loop_data_dir, extra_env=ENV)
    options = dict(GRADIENTS)  # the hand-started worker is a plain HivemindStrategy; admission on
    spec = digits_run(RUN, target_batch_size=TARGET_BATCH_SIZE, strategy_options=options)
    created = admin_post(orch, api.runs(), spec).json()
    swarm_id = created["swarm_id"]
    reader = RunReader(orch, RUN)
    # the worker a user starts by hand later: it imports now, and trains once its peer list appears
    saved, progress = tmp_path / "peers.json", tmp_path / "hand-progress.json"
    hand_worker = tmp_path / "hand-worker"
    hand = processes.start(
        "hand-worker",
        [
            sys.executable,
            "-m",
            "tests.programs.peer_list_worker",
            str(saved),
            swarm_id,
            str(TARGET_BATCH_SIZE),
            str(progress),
            str(hand_worker / "worker.json"),
        ],
        preloaded=True,
    )

    def training_with_addresses() -> list[dict[str, Any]] | None:
        """Both workers running and training (samples reported: past joining the swarm, which a worker
        does after its DHT is up), the swarm past epoch 0, and each worker's addresses reported (a worker
        sends them with a heartbeat once its DHT is up, which can come after its registration)."""
        running = reader.running()
        training = all(w["peer_maddrs"] and w["samples"] > 0 for w in running)
        ready = len(running) == 2 and training and reader.epoch() >= 1
        return running if ready else None

    running = wait_until(
        training_with_addresses, BOOT_S, message="2 workers train and report their addresses"
    )
    first, second = sorted(running, key=lambda w: int(w["id"]))
    second_ids = {peer_id(m) for m in second["peer_maddrs"]}
    wait_until(
        lambda: second_ids & {peer_id(m) for m in saved_peers(loop_data_dir, first)},
        30,
        message="the first worker's saved list names the second worker",
    )

    register_by_hand(orch, created["join_token"], swarm_id, hand_worker)
    orch.kill()  # kill -9: nobody answers the API or the orchestrator's DHT address any more
    (tmp_path / "peers.tmp").write_text(json.dumps({"initial_peers": saved_peers(loop_data_dir, first)}))
    (tmp_path / "peers.tmp").replace(saved)  # the hand-started worker, imported by now, goes on

    workers_only = [m for m in json.loads(saved.read_text())["initial_peers"] if peer_id(m) in second_ids]
    dht = monitor_dht(loop_data_dir / "swarm_authority.pem", swarm_id, workers_only)

    def one_swarm_of_three() -> list[int]:
        # peers publish progress at their own moments: in step means one epoch apart at most (with a
        # small target batch, epochs pass faster than all three records refresh)
        epochs = swarm_epochs(dht, swarm_id)
        return epochs if len(epochs) == 3 and max(epochs) - min(epochs) <= 1 else []

    try:
        epochs = wait_until(
            one_swarm_of_three, BOOT_S, interval_s=1, message="three peers at one epoch in the DHT"
        )
    finally:
        dht.shutdown()
    low = min(epochs)
    try:
        wait_until(
            lambda: (seen := json.loads(progress.read_text()))["num_peers"] == 3 and seen["epoch"] >= low,
            30,
            message="the hand-started worker counts three peers",
        )
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; the hand-started worker's log ends:\n{hand.log()[-4000:]}") from None

    restarted_at = datetime.now(UTC)
    orch = start_loop_orchestrator(
        processes, loop_data_dir, extra_env=ENV, port=orch.port, dht_port=orch.dht_port, name="orchestrator-2"
    )
    reader = RunReader(orch, RUN)

    counted_three: set[str] = set()  # peers' counts flicker at epoch changes: each must show 3 once

    def reattached() -> bool:
        by_id = {w["id"]: w for w in reader.workers()}
        pair = [by_id[first["id"]], by_id[second["id"]]]
        fresh = [
            w
            for w in pair
            if w["state"] == "running" and datetime.fromisoformat(w["last_heartbeat_at"]) > restarted_at
        ]
        counted_three.update(w["id"] for w in fresh if w["num_peers"] == 3)
        return len(fresh) == 2 and counted_three == {first["id"], second["id"]}

    wait_until(reattached, 90, interval_s=1, message="both workers running again, counting three peers")
    launched = [w for w in reader.workers() if not w["manual"]]
    assert len(launched) == 2, "no replacement was launched for the re-attached workers"
