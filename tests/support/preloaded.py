"""``spotswarm`` servers forked from a process that already imported them
(``tests/programs/preloaded_server.py``), one such process per test process, started at its first use.

:func:`spawn` returns a :class:`ForkedChild`, which a :class:`~tests.support.processes.ManagedProcess`
holds as it holds a ``subprocess.Popen``: ``pid``, ``poll()``, ``wait(timeout)``, ``returncode``. The
child is not this process's own (its parent is the preloaded process, which reports its exit code here),
so it is waited for through that report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

#: how long the preloaded process may take to import (seconds of CPU; minutes on a crowded machine)
READY_TIMEOUT_S = 180.0
#: how long it may take to answer a request to fork
FORK_TIMEOUT_S = 30.0


class PreloadedError(RuntimeError):
    """The preloaded process did not start or did not answer; its output says why."""


class ForkedChild:
    """A server forked by the preloaded process, with the part of ``subprocess.Popen`` the tests use."""

    def __init__(self, spawner: _Spawner, pid: int, args: Sequence[str]) -> None:
        self._spawner = spawner
        self.pid = pid
        self.args = list(args)

    @property
    def returncode(self) -> int | None:
        return self._spawner.exit_code(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        code = self._spawner.wait_for_exit(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code


class _Spawner:
    """The preloaded process of this test process and what it reported."""

    def __init__(self) -> None:
        self._log: IO[bytes] = tempfile.NamedTemporaryFile(prefix="preloaded-server-", suffix=".log")  # noqa: SIM115
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.programs.preloaded_server"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            cwd=str(Path(__file__).resolve().parents[2]),
            start_new_session=True,
        )
        self._changed = threading.Condition()
        self._ready = False
        self._replies: list[dict[str, object]] = []
        self._exits: dict[int, int] = {}
        self._ended = False
        self._request_lock = threading.Lock()
        threading.Thread(target=self._read, name="preloaded-server-reader", daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            message = json.loads(line)
            with self._changed:
                if "exit" in message:
                    self._exits[int(message["exit"])] = int(message["code"])
                elif "ready" in message:
                    self._ready = True
                else:
                    self._replies.append(message)
                self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def _output(self) -> str:
        return Path(self._log.name).read_text(errors="replace")[-4000:]

    def spawn(self, args: Sequence[str], env: Mapping[str, str], cwd: Path, log_path: Path) -> ForkedChild:
        request = {"argv": list(args), "env": dict(env), "cwd": str(cwd), "log_path": str(log_path)}
        with self._request_lock:
            with self._changed:
                if not self._changed.wait_for(lambda: self._ready or self._ended, READY_TIMEOUT_S):
                    raise PreloadedError(f"the preloaded server process is not ready:\n{self._output()}")
            assert self._proc.stdin is not None
            try:
                self._proc.stdin.write((json.dumps(request) + "\n").encode())
                self._proc.stdin.flush()
            except OSError as exc:
                raise PreloadedError(
                    f"the preloaded server process is gone: {exc}\n{self._output()}"
                ) from exc
            with self._changed:
                if not self._changed.wait_for(lambda: self._replies or self._ended, FORK_TIMEOUT_S):
                    raise PreloadedError(f"the preloaded server process did not fork:\n{self._output()}")
                if not self._replies:
                    raise PreloadedError(f"the preloaded server process ended:\n{self._output()}")
                reply = self._replies.pop(0)
        return ForkedChild(self, int(reply["pid"]), args)  # type: ignore[call-overload]

    def exit_code(self, pid: int) -> int | None:
        with self._changed:
            return self._exits.get(pid)

    def wait_for_exit(self, pid: int, timeout_s: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits or self._ended, timeout_s)
            return self._exits.get(pid)


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def spawn(args: Sequence[str], env: Mapping[str, str], cwd: Path, log_path: Path) -> ForkedChild:
    """Fork ``spotswarm`` (``args``: its console script's path, then its arguments) with exactly ``env``
    as its environment, in ``cwd``, its output appended to ``log_path``."""
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = _Spawner()
        spawner = _spawner
    return spawner.spawn(args, env, cwd, log_path)
