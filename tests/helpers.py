"""Helpers shared by the test suite: free ports, waiting on conditions, and processes that never leak."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import pytest

T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(predicate: Callable[[], T], timeout_s: float, interval_s: float = 0.2, message: str = "") -> T:
    """Poll ``predicate`` until it returns something truthy and return that; fail after ``timeout_s``.

    Exceptions raised by the predicate count as "not yet" and the last one is shown on time-out.
    """
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - a predicate may fail while the system starts
            last_error = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise TimeoutError(f"condition not met within {timeout_s:.0f} s: {message}{detail}")
        time.sleep(interval_s)


class ManagedProcess:
    """A subprocess in its own process group, so that its children (hivemind's p2pd) die with it."""

    def __init__(
        self,
        args: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.log_path = log_path
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in kill()
        self.popen = subprocess.Popen(
            list(args),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=str(cwd or REPO_ROOT),
            start_new_session=True,
        )
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def terminate(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM the group, wait, then SIGKILL what is left. Returns the exit code."""
        self.signal_group(signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        self.kill()
        return self.popen.returncode

    def kill(self) -> None:
        """SIGKILL the whole process group (by PID, never by name) and reap the leader."""
        self.signal_group(signal.SIGKILL)
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if not self._log.closed:
            self._log.close()


class ProcessRegistry:
    """Collects every process a test starts and kills them all at teardown."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.processes: list[ManagedProcess] = []

    def start(self, name: str, args: Sequence[str], env: Mapping[str, str] | None = None) -> ManagedProcess:
        proc = ManagedProcess(args, self.tmp_path / f"{name}.log", env=env)
        self.processes.append(proc)
        return proc

    def kill_all(self) -> None:
        for proc in self.processes:
            proc.kill()


def process_family(pid: int) -> dict[int, int]:
    """``pid``, its descendants and the members of its process group, each with its start time.

    Taken before a stop, it says afterwards what is still running of that process (see :func:`alive_of`).
    """
    from orchestrator.processes import descendants, proc_start_ticks

    members = {pid, *descendants(pid), *group_members(pid)}
    family = {member: proc_start_ticks(member) for member in members}
    return {member: ticks for member, ticks in family.items() if ticks is not None}


def group_members(pgid: int) -> list[int]:
    """Live processes of the process group ``pgid`` (orphans keep their group when init adopts them)."""
    from orchestrator.processes import stat_fields

    members = []
    for entry in os.listdir("/proc"):
        fields = stat_fields(int(entry)) if entry.isdigit() else None
        if fields is not None and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def alive_of(family: dict[int, int]) -> dict[int, str]:
    """The processes of a :func:`process_family` snapshot that still run, with their command lines."""
    from orchestrator.processes import proc_start_ticks

    return {pid: command_line(pid) for pid, ticks in family.items() if proc_start_ticks(pid) == ticks}


def orphans_with_env(name: str, value: str) -> dict[int, str]:
    """Processes adopted by init (parent PID 1) whose environment holds ``name=value``, by command line."""
    from orchestrator.processes import parent_of

    needle = f"{name}={value}".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or parent_of(int(entry)) != 1:
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found[int(entry)] = command_line(int(entry))
    return found


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def assert_family_ends(family: dict[int, int], marker_name: str, marker_value: str, within_s: float) -> None:
    """Wait until no process of a :func:`process_family` snapshot runs (fail after ``within_s``), then check
    that init adopted no process carrying the test's environment marker ``marker_name=marker_value``."""
    wait_until(
        lambda: not alive_of(family),
        within_s,
        interval_s=0.1,
        message=f"every process ends; still running: {alive_of(family)}",
    )
    assert orphans_with_env(marker_name, marker_value) == {}


def clear_spotswarm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset every ``SPOTSWARM_*`` variable for this test, so that settings read from the environment see
    only what the test sets (not the machine's or the CI's own)."""
    for name in list(os.environ):
        if name.upper().startswith("SPOTSWARM_"):
            monkeypatch.delenv(name)
