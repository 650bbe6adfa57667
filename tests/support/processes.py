"""Processes that never leak: each in its own process group, killed by group at the end of its test; and
what is left of a process family after a stop."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

from tests.support.preloaded import ForkedChild
from tests.support.preloaded import spawn as preloaded_spawn
from tests.support.waiting import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


class ManagedProcess:
    """A subprocess in its own process group, so that its children (hivemind's p2pd) die with it."""

    def __init__(
        self,
        args: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        *,
        preloaded: bool = False,
    ) -> None:
        self.log_path = log_path
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in kill()
        self.popen: subprocess.Popen[bytes] | ForkedChild
        if preloaded:  # forked with its imports done: tests/support/preloaded.py
            self.popen = preloaded_spawn(args, full_env, cwd or REPO_ROOT, log_path)
        else:
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

    def wait_for_exit(self, timeout_s: float, what: str) -> str:
        """Wait until the process has ended and return its log; fail with the log's end when it has not."""
        try:
            wait_until(lambda: self.popen.poll() is not None, timeout_s, message=f"{what} ends")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; its output so far:\n{self.log()[-4000:]}") from None
        return self.log()

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def terminate(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM the group, wait, then SIGKILL what is left. Returns the exit code."""
        self.signal_group(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=timeout_s)
        self.kill()
        return self.popen.returncode

    def kill(self) -> None:
        """SIGKILL the whole process group (by PID, never by name) and reap the leader."""
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)
        if not self._log.closed:
            self._log.close()


class ProcessRegistry:
    """Collects every process a test starts and kills them all at teardown."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.processes: list[ManagedProcess] = []

    def start(
        self, name: str, args: Sequence[str], env: Mapping[str, str] | None = None, *, preloaded: bool = False
    ) -> ManagedProcess:
        """Start ``args`` in a process group of its own, its output in ``<name>.log``. With ``preloaded``
        (``spotswarm``, ``spotswarm-worker`` or ``python -m tests.programs...``), forked with its imports
        done: :mod:`tests.support.preloaded`."""
        proc = ManagedProcess(args, self.tmp_path / f"{name}.log", env=env, preloaded=preloaded)
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


#: Seconds an orphan may take to leave by itself: torch's shared-memory manager (started by any process
#: that shares tensors through hivemind, and adopted by init at once: it starts in a session of its own)
#: leaves 2 s after its last client, and is never killed, since it frees its clients' shared memory.
ORPHAN_LEAVES_S = 10.0


def assert_family_ends(family: dict[int, int], marker_name: str, marker_value: str, within_s: float) -> None:
    """Wait until no process of a :func:`process_family` snapshot runs (fail after ``within_s``), then
    until init holds no process carrying the test's environment marker ``marker_name=marker_value`` (fail
    after :data:`ORPHAN_LEAVES_S`, naming them)."""
    wait_until(
        lambda: not alive_of(family),
        within_s,
        interval_s=0.1,
        message=f"every process ends; still running: {alive_of(family)}",
    )
    try:
        wait_until(
            lambda: not orphans_with_env(marker_name, marker_value),
            ORPHAN_LEAVES_S,
            interval_s=0.1,
            message="no process is left to init",
        )
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; left: {orphans_with_env(marker_name, marker_value)}") from exc


def clear_spotswarm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset every ``SPOTSWARM_*`` variable for this test, so that settings read from the environment see
    only what the test sets (not the machine's or the CI's own)."""
    for name in list(os.environ):
        if name.upper().startswith("SPOTSWARM_"):
            monkeypatch.delenv(name)
