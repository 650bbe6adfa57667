"""Processes forked from one that already imported what they import (``tests/programs/preloaded.py``):
``spotswarm`` (a server), ``spotswarm-worker`` and ``python -m <test program>``. One preloaded process of
each kind per test process, started at its first use.

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
    """A process forked by a preloaded process, with the part of ``subprocess.Popen`` the tests use."""

    def __init__(self, spawner: _Spawner, pid: int, args: Sequence[str]) -> None:
        self._spawner = spawner
        self.pid = pid
        self.args = list(args)

    @property
    def returncode(self) -> int | None:
        return self._spawner.exit_code(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # as Popen: no signal once its exit is known (its PID may be reused)
            os.kill(self.pid, sig)

    def wait(self, timeout: float | None = None) -> int:
        code = self._spawner.wait_for_exit(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code


class _Spawner:
    """A preloaded process of this test process (one ``kind``) and what it reported."""

    def __init__(self, kind: str) -> None:
        self._kind = kind
        self._log: IO[bytes] = tempfile.NamedTemporaryFile(prefix=f"preloaded-{kind}-", suffix=".log")  # noqa: SIM115
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.programs.preloaded", kind],
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
        threading.Thread(target=self._read, name=f"preloaded-{kind}-reader", daemon=True).start()

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

    def spawn(
        self, target: dict[str, str], args: Sequence[str], env: Mapping[str, str], cwd: Path, log_path: Path
    ) -> ForkedChild:
        argv = list(args[2:]) if "module" in target else list(args)  # ``python -m M``: M's arguments
        request = {**target, "argv": argv, "env": dict(env), "cwd": str(cwd), "log_path": str(log_path)}
        with self._request_lock:
            with self._changed:
                if not self._changed.wait_for(lambda: self._ready or self._ended, READY_TIMEOUT_S):
                    raise PreloadedError(
                        f"the preloaded {self._kind} process is not ready:\n{self._output()}"
                    )
            assert self._proc.stdin is not None
            try:
                self._proc.stdin.write((json.dumps(request) + "\n").encode())
                self._proc.stdin.flush()
            except OSError as exc:
                raise PreloadedError(
                    f"the preloaded {self._kind} process is gone: {exc}\n{self._output()}"
                ) from exc
            with self._changed:
                if not self._changed.wait_for(lambda: self._replies or self._ended, FORK_TIMEOUT_S):
                    raise PreloadedError(
                        f"the preloaded {self._kind} process did not fork:\n{self._output()}"
                    )
                if not self._replies:
                    raise PreloadedError(f"the preloaded {self._kind} process ended:\n{self._output()}")
                reply = self._replies.pop(0)
        return ForkedChild(self, int(reply["pid"]), args)  # type: ignore[call-overload]

    def exit_code(self, pid: int) -> int | None:
        with self._changed:
            return self._exits.get(pid)

    def wait_for_exit(self, pid: int, timeout_s: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits or self._ended, timeout_s)
            return self._exits.get(pid)


#: the preloaded processes, by kind
_spawners: dict[str, _Spawner] = {}
_spawners_lock = threading.Lock()


def plan(args: Sequence[str]) -> tuple[str, dict[str, str]]:
    """The kind of preloaded process that can run ``args`` and what its child runs; ValueError for a
    command it cannot."""
    program = Path(args[0]).name if args else ""
    if program == "spotswarm":
        return "server", {"main": "orchestrator.cli:main"}
    if program == "spotswarm-worker":
        return "worker", {"main": "worker.agent:main"}
    if (
        program.startswith("python")
        and len(args) > 2
        and args[1] == "-m"
        and args[2].startswith("tests.programs.")
    ):
        return "worker", {"module": args[2]}
    raise ValueError(f"no preloaded process runs {list(args)}")


def spawn(args: Sequence[str], env: Mapping[str, str], cwd: Path, log_path: Path) -> ForkedChild:
    """Fork ``args`` (see :func:`plan`) with exactly ``env`` as its environment, in ``cwd``, its output
    appended to ``log_path``."""
    kind, target = plan(args)
    with _spawners_lock:
        spawner = _spawners.get(kind) or _spawners.setdefault(kind, _Spawner(kind))
    return spawner.spawn(target, args, env, cwd, log_path)
