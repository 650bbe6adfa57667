"""The local launcher's side of its fork server (:mod:`orchestrator.launchers.forkserver_main`).

The fork server starts at the launcher's first launch (an orchestrator that never launches a local
worker never pays for its imports) and the launch waits for it; it ends with the launcher or the server.
Workers it forked outlive it. Whatever goes wrong with it (it does not start, it dies, a request fails) is
a :class:`ForkServerError`, and the launcher starts that worker in a fresh interpreter instead.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from orchestrator.launchers.forkserver_main import SLOT_ENV, SLOT_VALUE, SUPERVISOR_READY_S

logger = logging.getLogger(__name__)

#: how long a launch waits for the fork server's imports (about 5 s of CPU; minutes on a crowded machine)
READY_TIMEOUT_S = 120.0


class ForkServerError(Exception):
    """The fork server cannot start this worker; start it the plain way."""


class ForkServer:
    """Forks workers from one process that imported what they import. Thread-safe; one request at a time.

    ``base_env`` is the environment of the server process, and of every worker but for its ``SPOTSWARM_*``
    variables (read by the agent once it runs): a worker whose environment differs elsewhere cannot be
    forked from it. ``on_exit(pid, code)`` is called from a thread of its own when a worker's supervisor
    exits (``code`` as :class:`subprocess.Popen` gives it).
    """

    def __init__(
        self,
        base_env: Mapping[str, str],
        cwd: Path,
        log_path: Path,
        on_exit: Callable[[int, int], None],
        ready_timeout_s: float = READY_TIMEOUT_S,
    ) -> None:
        self._base_env = dict(base_env)
        self._cwd = cwd
        self._log_path = log_path
        self._on_exit = on_exit
        self._ready_timeout_s = ready_timeout_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._ready = threading.Event()  # set when it said it is ready, or its output ended
        self._ready_said = False
        self._failed: str | None = None  # why it never became ready: not tried again
        self._closed = False

    @property
    def pid(self) -> int | None:
        """The fork server's PID while it runs (it reports the exits of the workers it forked)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def fits(self, env: Mapping[str, str]) -> bool:
        """Whether a worker with ``env`` can be forked from it (see the class docstring)."""
        return _outside_agent(env) == _outside_agent(self._base_env)

    def warm_up(self) -> None:
        """Start it and wait until it is ready, unless it is; a failure is left for :meth:`start_worker`."""
        with self._lock, contextlib.suppress(ForkServerError):
            self._ensure_started()

    def start_worker(self, request: Mapping[str, Any]) -> int:
        """Fork the worker of ``request`` (the fields :class:`~orchestrator.launchers.forkserver_main.Job`
        takes); return its supervisor's PID, the leader of its process group."""
        with self._lock:
            proc = self._ensure_started()
            assert proc.stdin is not None
            try:
                proc.stdin.write((json.dumps(dict(request)) + "\n").encode())
                proc.stdin.flush()
                reply = self._replies.get(timeout=SUPERVISOR_READY_S + 5.0)
            except (OSError, ValueError, queue.Empty) as exc:
                raise ForkServerError(f"no answer from the fork server: {exc!r}") from exc
        if reply is None:
            raise ForkServerError("the fork server exited")
        if "pid" not in reply:
            raise ForkServerError(str(reply.get("error", reply)))
        return int(reply["pid"])

    def close(self) -> None:
        """End the fork server (closing its stdin ends it; its workers keep running)."""
        with self._lock:
            self._closed = True
            proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait(timeout=5)

    def _ensure_started(self) -> subprocess.Popen[bytes]:
        if self._closed:
            raise ForkServerError("the launcher is closed")
        if self._failed is not None:
            raise ForkServerError(self._failed)
        if self._proc is not None and self._proc.poll() is None and self._ready_said:
            return self._proc
        self._ready, self._ready_said, self._replies = threading.Event(), False, queue.Queue()
        env = {**self._base_env, "PYTHONUNBUFFERED": "1", SLOT_ENV: SLOT_VALUE}
        try:
            with open(self._log_path, "ab") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "orchestrator.launchers.forkserver_main", str(os.getpid())],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    env=env,
                    cwd=str(self._cwd),
                    start_new_session=True,  # a Ctrl-C in the server's terminal is for the server
                )
        except OSError as exc:
            self._failed = f"the fork server cannot start: {exc}"
            raise ForkServerError(self._failed) from exc
        self._proc = proc
        assert proc.stdout is not None
        threading.Thread(
            target=self._read,
            args=(proc.stdout, self._replies, self._ready),
            name="forkserver-reader",
            daemon=True,
        ).start()
        if not self._ready.wait(self._ready_timeout_s) or not self._ready_said:
            proc.kill()
            self._failed = f"the fork server did not start (log: {self._log_path})"
            raise ForkServerError(self._failed)
        logger.info("fork server ready (pid %d): local workers start preloaded", proc.pid)
        return proc

    def _read(
        self, stdout: IO[bytes], replies: queue.Queue[dict[str, Any] | None], ready: threading.Event
    ) -> None:
        """Sort one fork server's lines: readiness, exits of supervisors, replies to requests."""
        for line in stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if message.get("ready"):
                self._ready_said = True
                ready.set()
            elif "exit" in message:  # in a thread of its own: the callback may wait for a launch's lock
                exited = (int(message["exit"]), int(message["code"]))
                threading.Thread(target=self._on_exit, args=exited, name="forkserver-exit").start()
            else:
                replies.put(message)
        replies.put(None)
        ready.set()


def _outside_agent(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith("SPOTSWARM_") and k != "PYTHONUNBUFFERED"}
