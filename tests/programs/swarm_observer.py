"""Reads a run's swarm epoch from the DHT twice a second and prints it as a JSON line, on its own: it keeps
reading while the orchestrator is down (its DHT peer stays connected to the workers').

Usage: ``python -m tests.programs.swarm_observer SWARM_ID TARGET_BATCH_SIZE AUTHORITY_KEY PEER [PEER ...]``.
A run's swarm admits only peers with a token: the observer is an operator's monitoring peer, which signs
its own with the swarm authority key from the orchestrator's data dir (``tests/support/monitor_peer.py``).
"""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.swarm.dht import parse_progress, progress_key
from tests.support.dht_reads import read_latest
from tests.support.monitor_peer import monitor_dht


def main() -> None:
    swarm_id, target, authority_key, *peers = sys.argv[1:]
    dht = monitor_dht(Path(authority_key), swarm_id, peers)
    print(json.dumps({"started": True}), flush=True)
    while True:
        try:
            found = read_latest(dht, progress_key(swarm_id), attempts=1)
        except TimeoutError:
            continue  # noted on stderr; the next sample asks again
        progress = parse_progress(found.value if found else None, int(target), datetime.now(UTC))
        if progress is not None:
            print(
                json.dumps({"t": time.time(), "epoch": progress.epoch, "peers": progress.num_peers}),
                flush=True,
            )
        time.sleep(0.5)  # the sampling period


if __name__ == "__main__":
    main()
