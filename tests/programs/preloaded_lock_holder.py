"""What a worker forked from the fork server runs in the test of hivemind's shared locks.

``PRELOADED_ROLE=hold``: take the lock hivemind takes for each future it creates (``SharedBytes``'s, as a
worker does all the time) and print ``holding`` until killed. ``PRELOADED_ROLE=dht``: start a DHT on
127.0.0.1, print ``dht ready`` and exit 0; it blocks in the DHT's start where that lock is held by a
killed process of its family.
"""

from __future__ import annotations

import os
import signal

import hivemind
from hivemind.utils.mpfuture import SharedBytes


def main() -> None:
    if os.environ["PRELOADED_ROLE"] == "hold":
        SharedBytes._lock.acquire()
        print("holding", flush=True)
        signal.pause()  # until killed
        return
    dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    print("dht ready", flush=True)
    dht.shutdown()


if __name__ == "__main__":
    main()
