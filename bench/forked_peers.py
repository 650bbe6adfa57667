"""Peers the benchmarks fork: each in its own process group, so that one SIGKILL ends the peer with the
DHT, averager and p2pd processes hivemind started under it."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable
from multiprocessing.process import BaseProcess


def kill_peers(procs: Iterable[BaseProcess]) -> None:
    """SIGKILL each started peer's process group (each peer calls ``os.setsid()`` first) and reap it."""
    for proc in procs:
        if proc.pid is None:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.join(timeout=5)
