"""How ``spotswarm serve`` and ``spotswarm demo`` stop: within a bounded grace, leaving nothing behind.

The first SIGTERM or Ctrl-C starts uvicorn's graceful stop (no new connections, open requests get up to
10 s), then the app's lifespan stops its services, the import probe and the DHT peer. A watchdog bounds
the whole stop: ``shutdown_grace_s`` after the signal, whatever still runs of the server is killed and it
exits with code 1. A second Ctrl-C does that at once (exit code 130).

"Of the server" means its descendants, except local workers (a process whose environment carries the
local launcher's marker, with its subtree): they outlive an orchestrator restart by design and a new
server adopts them. The demo counts its workers in (``include_workers``): it stops its run first, and
what has not left by then is killed with the rest. torch's shared-memory manager is never killed: it
leaves by itself 2 s after its last client and frees the shared memory segments as it goes.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from types import FrameType

import uvicorn

from orchestrator import processes
from orchestrator.cli.client import EXIT_ERROR
from orchestrator.cli.command import EXIT_INTERRUPTED
from orchestrator.launchers.local import LAUNCH_MARKER_ENV

logger = logging.getLogger(__name__)


TORCH_SHM_MANAGER = "torch_shm_manager"


def is_local_worker(pid: int) -> bool:
    """True for a process started by the local launcher (or one of its children)."""
    return processes.has_env(pid, LAUNCH_MARKER_ENV)


def own_processes(include_workers: bool) -> list[int]:
    """This server's processes to end (see the module docstring), parents first."""

    def left_alone(pid: int) -> bool:
        if processes.runs_command(pid, TORCH_SHM_MANAGER):
            return True
        return not include_workers and is_local_worker(pid)

    return processes.descendants(os.getpid(), prune=left_alone)


class StoppingServer(uvicorn.Server):
    """A uvicorn server whose stop is bounded by ``shutdown_grace_s`` and leaves none of its processes."""

    def __init__(
        self, config: uvicorn.Config, shutdown_grace_s: float, *, include_workers: bool = False
    ) -> None:
        super().__init__(config)
        self.shutdown_grace_s = shutdown_grace_s
        self.include_workers = include_workers
        self._deadline_lock = threading.Lock()
        self._deadline: float | None = None
        self.stopped_by: int | None = None  # the first signal that stopped it

    @property
    def interrupted(self) -> bool:
        """Stopped by Ctrl-C (SIGINT). uvicorn re-raises that signal once it has stopped, but the re-raise
        does nothing where the server was started with SIGINT ignored (a job started in the background of
        a script, ``nohup``), so the exit status asks this instead."""
        return self.stopped_by == signal.SIGINT

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """First SIGTERM/Ctrl-C: graceful stop under the deadline; a second Ctrl-C: force it now."""
        if self.should_exit and sig == signal.SIGINT:
            self.exit_now("a second Ctrl-C", EXIT_INTERRUPTED)
        if self.stopped_by is None:
            self.stopped_by = sig
        self.arm_deadline(self.shutdown_grace_s)
        super().handle_exit(sig, frame)

    def arm_deadline(self, seconds: float) -> None:
        """Exit (killing this server's processes) ``seconds`` from now unless the process is gone by then.

        Only the first call counts: a stop's deadline never moves.
        """
        with self._deadline_lock:
            if self._deadline is not None:
                return
            self._deadline = time.monotonic() + seconds
        threading.Thread(target=self._expire, args=(seconds,), name="stop-deadline", daemon=True).start()

    def _expire(self, seconds: float) -> None:
        assert self._deadline is not None
        while (left_s := self._deadline - time.monotonic()) > 0:
            time.sleep(left_s)
        self.exit_now(f"still stopping {seconds:.0f} s after the stop signal", EXIT_ERROR)

    def exit_now(self, why: str, exit_code: int) -> None:
        """Kill this server's processes (see the module docstring) and end the process with ``exit_code``."""
        killed = processes.signal_all(own_processes(self.include_workers), signal.SIGKILL)
        logger.error("%s: killed %d process(es) of the server, exiting now", why, len(killed))
        logging.shutdown()
        os._exit(exit_code)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's stop (connections, then the app's lifespan), then whatever is left of the server."""
        await super().shutdown(sockets)
        left = own_processes(self.include_workers)
        if left:
            names = ", ".join(f"{pid} ({processes.command_name(pid)})" for pid in left)
            logger.warning("stopping what is left of the server: %s", names)
            processes.signal_all(left, signal.SIGKILL)
