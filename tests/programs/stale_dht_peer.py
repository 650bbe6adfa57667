"""Leave a DHT peer behind on a data dir, as a crashed orchestrator did before its peer ended with it.

``python stale_dht_peer.py <data_dir>`` starts a plain ``hivemind.DHT`` (hivemind's own child set-up:
SIGINT ignored, no parent-death signal) with the data dir's identity on a free port, writes the
orchestrator's pid file for it, prints ``stale peer <pid> <port>`` and exits without shutting it down.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import hivemind

from orchestrator.swarm.dht_process import record_peer


def main() -> None:
    data_dir = Path(sys.argv[1])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    identity = str(data_dir / "dht_identity.key")
    dht = hivemind.DHT(start=True, host_maddrs=[f"/ip4/127.0.0.1/tcp/{port}"], identity_path=identity)
    record_peer(data_dir / "dht.pid", dht.pid)
    print(f"stale peer {dht.pid} {port}", flush=True)
    os._exit(0)  # a crash: no shutdown, no exit handlers


if __name__ == "__main__":
    main()
