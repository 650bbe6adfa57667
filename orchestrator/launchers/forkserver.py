"""The server's side of its fork server (:mod:`orchestrator.launchers.forkserver_main`): one process that
has imported Lightning, torch and hivemind, shared by the local launcher (which forks workers from it)
and the import check (which runs each check in a child forked from it).

It starts at its first use or :meth:`ForkServer.warm_up` (the server warms it up as it starts when it
checks imports or runs its reconcile loop; otherwise the first local launch waits for it), and ends when
closed or with the server.
Workers it forked outlive it. Whatever goes wrong with it (it does not start in time, it dies, a request
fails) is a :class:`ForkServerError`: the launcher then starts that worker in a fresh interpreter, and
the import check reports itself unavailable.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from orchestrator.launchers.forkserver_main import SLOT_ENV, SLOT_VALUE, SUPERVISOR_READY_S

logger = logging.getLogger(__name__)

#: how long its first use waits for its imports (about 5 s of CPU; minutes on a crowded machine)
READY_TIMEOUT_S = 120.0
#: a fork server told to stop has this long before it is killed
EXIT_WAIT_S = 3.0


class ForkServerError(Exception):
    """The fork server cannot serve this request."""


class ForkServer:
    """A process that imported what workers import, forking on request. Thread-safe; one request at a
    time (a call waits for the one before it).

    ``base_env`` is its environment, the allow-listed environment of the server (and of every worker
    but for its ``SPOTSWARM_*`` variables, read by the agent once it runs): a worker whose environment
    differs elsewhere cannot be forked from it. ``cwd`` is its working directory, first on its import
    path as a worker's. Its output goes to ``log_path``, or to the server's stderr.
    """

    def __init__(self, base_env: Mapping[str, str], cwd: Path, log_path: Path | None = None) -> None:
        self._base_env = dict(base_env)
        self._cwd = cwd
        self._log_path = log_path
        self._exit_watchers: list[Callable[[int, int], None]] = []
        self._request_lock = threading.Lock()  # one request (or start) at a time
        self._state_lock = threading.Lock()  # guards _proc and _closed; never held while waiting
        self._proc: subprocess.Popen[bytes] | None = None
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._ready = threading.Event()  # set when it said it is ready, or its output ended
        self._ready_said = False
        self._failed: str | None = None  # it exited before it was ready: not tried again
        self._closed = False

    @property
    def pid(self) -> int | None:
        """Its PID while it runs (it reports the exits of the workers it forked)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def fits(self, env: Mapping[str, str]) -> bool:
        """Whether a worker with ``env`` can be forked from it (see the class docstring)."""
        return _outside_agent(env) == _outside_agent(self._base_env)

    def watch_exits(self, watcher: Callable[[int, int], None]) -> None:
        """Call ``watcher(pid, code)``, from a thread of its own, when a worker's supervisor it forked
        exits (``code`` as :class:`subprocess.Popen` gives it: negative for a signal)."""
        self._exit_watchers.append(watcher)

    def warm_up(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Start it and wait until it is ready (at most ``timeout_s``); a failure is left for the next
        request to report."""
        with self._request_lock:
            try:
                self._ensure_started(time.monotonic() + timeout_s)
            except ForkServerError as exc:
                logger.debug("fork server warm-up: %s", exc)

    def start_worker(self, request: Mapping[str, Any]) -> int:
        """Fork the worker of ``request`` (the fields :class:`~orchestrator.launchers.forkserver_main.Job`
        takes); return its supervisor's PID, the leader of its process group."""
        reply = self._request(dict(request), time.monotonic() + READY_TIMEOUT_S, SUPERVISOR_READY_S + 5.0)
        if "pid" not in reply:
            raise ForkServerError(str(reply.get("error", reply)))
        return int(reply["pid"])

    def call(self, function: str, argument: Mapping[str, Any], deadline: float) -> dict[str, Any]:
        """``function(argument)`` (``"module:name"``, imported there) run in the fork server, which
        answers with its JSON result, before ``deadline`` (monotonic; the fork server is killed if not)."""
        reply = self._request({"call": function, "argument": dict(argument)}, deadline, None)
        if "error" in reply and "result" not in reply:
            raise ForkServerError(str(reply["error"]))
        return dict(reply["result"])

    def close(self) -> None:
        """End it (closing its stdin ends it; the workers it forked keep running); does not wait for a
        request in progress, which fails."""
        with self._state_lock:
            self._closed = True
            proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=EXIT_WAIT_S)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait(timeout=EXIT_WAIT_S)

    def _request(self, message: dict[str, Any], deadline: float, reply_s: float | None) -> dict[str, Any]:
        """Send ``message``, return the reply: within ``reply_s`` of sending, or by ``deadline``."""
        with self._request_lock:
            proc = self._ensure_started(deadline)
            assert proc.stdin is not None
            wait_s = reply_s if reply_s is not None else max(0.0, deadline - time.monotonic())
            try:
                proc.stdin.write((json.dumps(message) + "\n").encode())
                proc.stdin.flush()
                reply = self._replies.get(timeout=wait_s)
            except queue.Empty as exc:
                self._kill(proc)  # a fork server that does not answer is of no use any more
                raise ForkServerError(f"no answer from the fork server within {wait_s:.0f} s") from exc
            except (OSError, ValueError) as exc:  # ValueError: its stdin was closed by close()
                raise ForkServerError(f"the fork server is gone: {exc}") from exc
        if reply is None:
            raise ForkServerError("the fork server exited")
        return reply

    def _ensure_started(self, deadline: float) -> subprocess.Popen[bytes]:
        with self._state_lock:
            if self._closed:
                raise ForkServerError("closed (the server is stopping)")
            if self._failed is not None:
                raise ForkServerError(self._failed)
            proc = self._proc
            if proc is None or proc.poll() is not None:
                proc = self._spawn()
        if not self._ready.wait(max(0.0, deadline - time.monotonic())):
            raise ForkServerError("the fork server is still importing")
        if not self._ready_said:
            self._failed = "the fork server exited before it was ready (see the server's log)"
            raise ForkServerError(self._failed)
        return proc

    def _spawn(self) -> subprocess.Popen[bytes]:
        self._ready, self._ready_said, self._replies = threading.Event(), False, queue.Queue()
        env = {**self._base_env, "PYTHONUNBUFFERED": "1", SLOT_ENV: SLOT_VALUE}
        try:
            log = open(self._log_path, "ab") if self._log_path is not None else None  # noqa: SIM115
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "orchestrator.launchers.forkserver_main", str(os.getpid())],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    env=env,
                    cwd=str(self._cwd),
                    start_new_session=True,  # a Ctrl-C in the server's terminal is for the server
                )
            finally:
                if log is not None:
                    log.close()
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
        return proc

    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        with self._state_lock:
            if self._proc is proc:
                self._proc = None
        proc.kill()
        proc.wait(timeout=EXIT_WAIT_S)

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
                logger.info("fork server ready (pid %s)", message.get("pid"))
            elif "exit" in message:  # in a thread of its own: a watcher may wait for a launch's lock
                exited = (int(message["exit"]), int(message["code"]))
                for watcher in self._exit_watchers:
                    threading.Thread(target=watcher, args=exited, name="forkserver-exit").start()
            else:
                replies.put(message)
        replies.put(None)
        ready.set()


def _outside_agent(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith("SPOTSWARM_") and k != "PYTHONUNBUFFERED"}
