"""A DiLoCo peer without Lightning that trains and runs rounds until killed:
``python -m tests.programs.diloco_peer INITIAL_PEER STATUS``.

It joins the swarm at ``INITIAL_PEER`` (a multiaddr), then repeats: five inner steps of the tiny model of
:mod:`tests.support.diloco`, then a round. Before each round it rewrites STATUS (JSON: ``rounds`` done,
``in_round`` true, the outcomes so far), so a test can kill it while it waits in a round. It ends by
itself after ``MAX_RUN_S``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from tests.support.diloco import make_peer, start_dht

MAX_RUN_S = 120.0


def write(path: Path, status: dict[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(status))
    os.replace(tmp, path)


def main(initial_peer: str, status_path: Path) -> None:
    dht = start_dht([initial_peer])
    peer = make_peer(dht)
    outcomes: list[str] = []
    ends_at = time.monotonic() + MAX_RUN_S
    try:
        while time.monotonic() < ends_at:
            peer.train(5, seed=len(outcomes) + 1000)
            write(status_path, {"rounds": len(outcomes), "in_round": True, "outcomes": outcomes})
            outcomes.append(peer.optimizer.run_round().value)
    finally:
        peer.optimizer.shutdown()
        dht.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
