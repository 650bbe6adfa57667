"""Running a benchmark script the way its smoke tests do: in a scratch TMPDIR of its own, so that every
process it starts (the orchestrator's and the workers' sessions too, which inherit it) can be found and
killed by that TMPDIR afterwards, and a SIGTERM to the script can be checked to leave nothing running."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.support.processes import REPO_ROOT, ManagedProcess, ProcessRegistry, command_line
from tests.support.waiting import wait_until


def processes_with_env(entry: str) -> list[int]:
    """PIDs of this user's processes whose environment holds ``entry`` (``NAME=value``)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if entry.encode() in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A script's TMPDIR; afterwards whatever still runs with it (when a test failed) is killed by PID. A
    short path: torch's shared-memory manager puts a Unix socket under it (at most 107 bytes), and
    pytest's per-test directories under a parallel run's worker are longer than that leaves room for."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        for pid in processes_with_env(f"TMPDIR={path}"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(path, ignore_errors=True)


def start_script(
    processes: ProcessRegistry, name: str, script: str, args: list[str], scratch: Path
) -> ManagedProcess:
    """``bench/<script> ARGS`` with ``scratch`` as its TMPDIR (and its children's)."""
    argv = [sys.executable, str(REPO_ROOT / "bench" / script), *args]
    return processes.start(name, argv, env={"TMPDIR": str(scratch)})


def nothing_left(scratch: Path, within_s: float = 30) -> None:
    """Wait until no process started under ``scratch`` runs (fail with their command lines)."""
    wait_until(
        lambda: not processes_with_env(f"TMPDIR={scratch}"),
        within_s,
        message=lambda: (
            "everything the script started is gone: "
            + str({pid: command_line(pid) for pid in processes_with_env(f"TMPDIR={scratch}")})
        ),
    )


def sigterm_once_a_worker_runs(bench: ManagedProcess, scratch: Path) -> int | None:
    """Wait until a worker agent the script launched runs, SIGTERM the script (as a test's time-out or a
    Ctrl-C in a pipeline would), and return its exit code (None: it had ended before)."""

    def agents() -> list[int]:
        return [p for p in processes_with_env(f"TMPDIR={scratch}") if "worker.agent" in command_line(p)]

    wait_until(agents, 200, interval_s=0.5, message=lambda: f"a worker agent runs: {bench.log()[-3000:]}")
    return bench.terminate(timeout_s=60)
