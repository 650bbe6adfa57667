"""Peers the benchmarks fork: each in its own process group, so that one SIGKILL ends the peer with the
DHT, averager and p2pd processes hivemind started under it, and with hivemind's inter-process locks of
its own, so that killing it cannot leave a lock held that its siblings or the parent still use."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterable
from multiprocessing.process import BaseProcess


def become_peer(log_path: str, *, stdout: bool = True) -> None:
    """First thing in a forked peer: its own process group and hivemind locks, its output to ``log_path``."""
    os.setsid()
    if "hivemind" in sys.modules:  # imported before the fork: its locks are the parent's
        from worker._hivemind_compat import own_mpfuture_locks

        own_mpfuture_locks()
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    if stdout:
        os.dup2(log, 1)
    os.dup2(log, 2)


def kill_peers(procs: Iterable[BaseProcess]) -> None:
    """SIGKILL each started peer's process group (each peer calls ``os.setsid()`` first) and reap it."""
    for proc in procs:
        if proc.pid is None:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.join(timeout=5)
