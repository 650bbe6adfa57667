"""Reads a run's swarm epoch from the DHT twice a second and prints it as a JSON line, on its own: it keeps
reading while the orchestrator is down (its DHT peer stays connected to the workers').

Usage: ``python -m tests.e2e.swarm_observer SWARM_ID TARGET_BATCH_SIZE PEER [PEER ...]``. Needs a swarm
without admission tokens (``strategy_options: {"swarm_admission": false}``).
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timezone

import hivemind
from hivemind.dht.crypto import RSASignatureValidator

from orchestrator.swarm.dht import parse_progress, progress_key


def main() -> None:
    swarm_id, target, *peers = sys.argv[1:]
    dht = hivemind.DHT(
        initial_peers=peers,
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        record_validators=[RSASignatureValidator()],
        start=True,
    )
    print(json.dumps({"started": True}), flush=True)
    while True:
        found = dht.get(progress_key(swarm_id), latest=True)
        progress = parse_progress(found.value if found else None, int(target), datetime.now(timezone.utc))
        if progress is not None:
            print(
                json.dumps({"t": time.time(), "epoch": progress.epoch, "peers": progress.num_peers}),
                flush=True,
            )
        time.sleep(0.5)  # the sampling period


if __name__ == "__main__":
    main()
