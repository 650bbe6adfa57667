"""A peer that joins a run's swarm the way the worker agent does: ``python -m tests.programs.joining_peer
CONFIG OUT``.

It imports everything, prints ``ready``, then waits for CONFIG to appear, so a test decides when the
peers join. CONFIG (JSON) holds ``initial_peers`` and ``swarm_id`` (from a registration), ``stop_file``,
and, for a run with swarm admission, ``admission``: ``{"url", "worker_id", "worker_token",
"worker_dir"}`` (the token is fetched as the agent fetches it). The DHT starts through the agent's own code
(``worker.agent.training.start_swarm_dht_retrying``: a bootstrap that no initial peer answers is tried again,
and fails after the last try); then the peer publishes a progress record under the run's key every
second, as hivemind's ProgressTracker does, and counts the records it reads. OUT (JSON, rewritten) says
whether it joined and the most peers it has seen; it runs until ``stop_file`` exists.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from hivemind.dht.crypto import RSASignatureValidator
from hivemind.optim.progress_tracker import LocalTrainingProgress
from hivemind.utils.timed_storage import get_dht_time

from tests.support.dht_reads import read_latest
from tests.support.waiting import wait_for_file
from worker.admission.authorizer import SwarmAuthorizer
from worker.agent.client import OrchestratorClient
from worker.agent.token_cache import CachingTokenSource, ClientTokenSource, identity_path
from worker.agent.training import start_swarm_dht_retrying

RECORD_TTL_S = 10.0
MAX_RUN_S = 300.0
CONFIG_WAIT_S = 300.0


def write(out: Path, result: dict[str, Any]) -> None:
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, out)


def authorizer_for(config: dict[str, Any]) -> SwarmAuthorizer | None:
    admission = config.get("admission")
    if admission is None:
        return None
    url, worker_id, token = admission["url"], admission["worker_id"], admission["worker_token"]
    worker_dir = Path(admission["worker_dir"])
    source = CachingTokenSource(
        ClientTokenSource(lambda: OrchestratorClient(url, token), worker_id), worker_dir, worker_id
    )
    return SwarmAuthorizer.create(config["swarm_id"], source, identity_path(worker_dir, worker_id))


def peers_seen(dht: Any, key: str) -> int:
    found = read_latest(dht, key)
    if found is None or not isinstance(found.value, dict):
        return 0
    return sum(1 for item in found.value.values() if isinstance(item.value, dict))


def main(config_path: str, out_path: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print("ready", flush=True)
    config = json.loads(wait_for_file(Path(config_path), CONFIG_WAIT_S).read_text())
    out, stop = Path(out_path), Path(config["stop_file"])
    options = {"host_maddrs": ["/ip4/127.0.0.1/tcp/0"]}
    try:
        dht = start_swarm_dht_retrying(config["initial_peers"], options, authorizer_for(config), list)
    except RuntimeError as exc:
        write(out, {"joined": False, "error": str(exc)})
        return
    validator = RSASignatureValidator()  # the process-wide key, as ProgressTracker signs with
    key = f"{config['swarm_id']}_progress"
    result: dict[str, Any] = {"joined": True, "most_peers_seen": 0}
    deadline = time.monotonic() + MAX_RUN_S
    while not stop.exists() and time.monotonic() < deadline:
        record = LocalTrainingProgress(
            peer_id=dht.peer_id.to_bytes(),
            epoch=0,
            samples_accumulated=0,
            samples_per_second=1.0,
            time=get_dht_time(),
            client_mode=False,
        )
        expiration = get_dht_time() + RECORD_TTL_S
        dht.store(key, subkey=validator.local_public_key, value=record.dict(), expiration_time=expiration)
        result["most_peers_seen"] = max(result["most_peers_seen"], peers_seen(dht, key))
        write(out, result)
        time.sleep(1.0)
    dht.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:3])
