"""The DHT peer's process: it ends with the server, and a start finds one a crashed server left behind.

hivemind's ``DHT`` is a forked ``multiprocessing`` process that runs hivemind's ``p2pd`` as its child.
Left as hivemind makes it, it outlives the server: it ignores SIGINT, it inherits uvicorn's SIGTERM
handler through the fork (which only sets a flag in the child's copy of the server), and it keeps its
own copy of the pipe it reads commands from, so it never sees the server go. Then ``DHT.shutdown``'s
last resort, ``terminate()``, does nothing, a server killed by a signal leaves it behind with parent 1,
and a server that exits normally waits forever in multiprocessing's exit handler that joins it. In the
server's process group, its ``p2pd`` takes a terminal's Ctrl-C as its own and closes at once (with an
error line), so the peer's orderly leave then times out.

:class:`ServerDHT` makes the child leave, taking ``p2pd`` with it, on SIGTERM and as soon as the server
exits, even when killed with SIGKILL (:func:`orchestrator.processes.exit_with_parent`), and puts it in a
process group of its own, which a Ctrl-C does not reach: the server stops it in order. The pid file
(``<data_dir>/dht.pid``) covers what is left: a start finds a peer whose server is gone and stops it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path
from types import FrameType
from typing import Any

from orchestrator import files, processes

logger = logging.getLogger(__name__)

KILL_WAIT_S = 5.0  # how long a stopped peer process has to disappear before the next step


class StalePeerRunning(RuntimeError):
    """The pid file names a DHT peer whose server still runs: another orchestrator uses this data dir."""


def server_dht_class() -> type[Any]:
    """hivemind's ``DHT`` with the child set up as the module docstring says (hivemind imported late)."""
    import hivemind

    from worker._hivemind_compat import survive_unreadable_requests

    class ServerDHT(hivemind.DHT):  # type: ignore[misc, name-defined]
        """A ``hivemind.DHT`` whose process ends with the server (see the module docstring)."""

        server_pid = 0  # set before start(); the child reads its copy

        def run(self) -> None:
            # A process group of its own: a terminal's Ctrl-C goes to the server's group, and p2pd (its
            # child, which catches SIGINT) would close under the peer before the server asks it to leave.
            os.setpgid(0, 0)
            signal.signal(signal.SIGTERM, _leave_with_children)  # not uvicorn's handler, copied by fork
            processes.exit_with_parent(self.server_pid, exit_code=128 + signal.SIGTERM)
            survive_unreadable_requests(self)
            super().run()

    return ServerDHT


def start_server_dht(**kwargs: Any) -> Any:
    """Start a :class:`ServerDHT` with hivemind's keywords and wait until it is ready (raises as hivemind)."""
    dht = server_dht_class()(start=False, **kwargs)
    dht.server_pid = os.getpid()
    dht.run_in_background(await_ready=True)
    return dht


def _leave_with_children(signum: int, frame: FrameType | None) -> None:  # noqa: ARG001 - a signal handler's signature
    """SIGTERM in the peer's process: end ``p2pd`` (and anything else it started), then leave at once."""
    processes.leave_with_children(128 + signum)


def stop_process_tree(pid: int, wait_s: float = KILL_WAIT_S) -> bool:
    """SIGTERM ``pid`` (a peer leaves with its children), then SIGKILL its tree if it is still there.

    Returns True once ``pid`` is gone (a zombie counts as gone: its parent reaps it).
    """
    family = [pid, *processes.descendants(pid)]
    processes.signal_all([pid], signal.SIGTERM)
    if _wait_gone(pid, wait_s):
        processes.signal_all(family[1:], signal.SIGKILL)  # children of a peer without our SIGTERM handler
        return True
    processes.signal_all([*family, *processes.descendants(pid)], signal.SIGKILL)
    return _wait_gone(pid, wait_s)


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while processes.parent_of(pid) is not None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def record_peer(pid_path: Path, peer_pid: int) -> None:
    """Write the pid file of a running peer: its PID and the server's, each with its start time."""
    server_pid = os.getpid()
    record = {
        "pid": peer_pid,
        "start_ticks": processes.proc_start_ticks(peer_pid),
        "server_pid": server_pid,
        "server_start_ticks": processes.proc_start_ticks(server_pid),
    }
    files.write_atomic(pid_path, json.dumps(record))


def forget_peer(pid_path: Path) -> None:
    pid_path.unlink(missing_ok=True)


def stop_stale_peer(pid_path: Path) -> int | None:
    """Stop a DHT peer left running by a server on this data dir that ended; return its PID if one was.

    A PID counts only if its start time matches the record (PIDs are reused). Raises
    :class:`StalePeerRunning` when the recorded server itself still runs.
    """
    try:
        record = json.loads(pid_path.read_text())
        pid, start_ticks = int(record["pid"]), record["start_ticks"]
        server_pid, server_ticks = int(record["server_pid"]), record["server_start_ticks"]
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        logger.warning("ignoring an unreadable DHT pid file %s", pid_path)
        forget_peer(pid_path)
        return None
    if start_ticks is None or processes.proc_start_ticks(pid) != start_ticks:
        forget_peer(pid_path)
        return None
    if server_pid != os.getpid() and processes.proc_start_ticks(server_pid) == server_ticks:
        raise StalePeerRunning(
            f"the DHT peer (pid {pid}) of another orchestrator (pid {server_pid}) runs on this data dir; "
            "stop that orchestrator first or use another --data-dir"
        )
    logger.warning(
        "a DHT peer (pid %d) left by an orchestrator that ended is still running: stopping it", pid
    )
    if not stop_process_tree(pid):
        logger.error("the leftover DHT peer (pid %d) did not stop", pid)
    forget_peer(pid_path)
    return pid
