"""A family of processes forked from one hivemind importer, one killed while it holds hivemind's send lock.

``python -m tests.programs.forked_peer_locks [--own-locks]``: forks a peer that takes ``MPFuture``'s
inter-process lock (as it does for each result it sends) and kills it with SIGKILL there; then forks a
second peer (calling ``own_mpfuture_locks`` first with ``--own-locks``) that starts a DHT. Prints
``ready`` and exits 0 if the second peer's DHT reported ready within 10 s, prints ``blocked`` and exits 1
otherwise. Run in its own interpreter: without the fix the lock stays held for this whole family.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys

import hivemind
from hivemind.utils.mpfuture import MPFuture

from tests.support.waiting import wait_until
from worker._hivemind_compat import own_mpfuture_locks

READY_S = 10.0


def holds_the_lock_until_killed() -> None:
    MPFuture._update_lock.acquire()
    signal.pause()  # until killed


def held_by_another() -> bool:
    if MPFuture._update_lock.acquire(block=False):
        MPFuture._update_lock.release()
        return False
    return True


def starts_a_dht(own_locks: bool) -> None:
    os.setsid()
    if own_locks:
        own_mpfuture_locks()
    dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    dht.shutdown()
    os._exit(0)


def main() -> int:
    own_locks = "--own-locks" in sys.argv
    context = mp.get_context("fork")
    holder = context.Process(target=holds_the_lock_until_killed)
    holder.start()
    wait_until(held_by_another, 10, interval_s=0.05, message="the holder takes the lock")
    os.kill(holder.pid or 0, signal.SIGKILL)
    holder.join()
    peer = context.Process(target=starts_a_dht, args=(own_locks,))
    peer.start()
    peer.join(READY_S)
    if peer.exitcode == 0:
        print("ready")
        return 0
    os.killpg(peer.pid or 0, signal.SIGKILL)
    peer.join()
    print("blocked")
    return 1


if __name__ == "__main__":
    sys.exit(main())
