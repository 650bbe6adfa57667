"""Process helpers of the local launcher: process groups, env markers, exit files, logs.

Linux only (``/proc``). A PID alone does not identify a process after an orchestrator restart because
PIDs are reused; the pair (PID, start time) does: :func:`orchestrator.processes.proc_start_ticks`.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

# Runs the worker command as the group leader's only child and records its exit status in a file, so a
# later orchestrator process that adopted the worker (and cannot wait() on it) still learns the code.
# The trap keeps the shell alive when the group gets SIGTERM until the worker has exited; handlers are
# reset on exec, so the worker itself sees the default dispositions.
SUPERVISOR_SCRIPT = (
    'trap : TERM INT HUP; exit_file=$1; shift; "$@"; code=$?; '
    'echo "$code" > "$exit_file.tmp" && mv "$exit_file.tmp" "$exit_file"; exit "$code"'
)


def only_child(pid: int) -> int | None:
    """The one child of ``pid`` (a supervisor's: the worker agent), or None while it has none or when
    ``pid`` is gone. Reads ``/proc/<pid>/task/<pid>/children``, not the whole of ``/proc``."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if len(children) == 1 else None


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to the process group; False if the group is already empty."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def processes_with_marker(marker_name: str, marker_value: str) -> list[tuple[int, int]]:
    """``(pid, pgid)`` of every process whose environment holds ``marker_name=marker_value``.

    Children inherit the environment, so this finds a worker's whole family (its supervisor, the agent,
    hivemind's p2pd) without trusting a PID or PGID that the kernel may have reused.
    """
    needle = f"{marker_name}={marker_value}".encode()
    found: list[tuple[int, int]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            if needle in environ.split(b"\0"):
                found.append((int(entry.name), os.getpgid(int(entry.name))))
        except (OSError, ProcessLookupError):
            continue
    return found


def read_exit_file(path: Path) -> int | None:
    """The exit code the supervisor recorded, or None if it wrote none (killed by SIGKILL, still running)."""
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def log_tail(path: Path, max_lines: int = 12, max_bytes: int = 4096) -> str:
    """The last lines of a worker's log, joined with `` | `` to fit in one failure reason."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read()
    except FileNotFoundError:
        return "(no log)"
    lines = [line.strip() for line in data.decode(errors="replace").splitlines() if line.strip()]
    return " | ".join(lines[-max_lines:]) or "(empty log)"


def describe_exit(code: int | None) -> str:
    """Human words for an exit code as the supervisor or Popen reports it."""
    if code is None:
        return "exited with an unknown status (killed with SIGKILL or while no launcher watched it)"
    signum = -code if code < 0 else code - 128 if code > 128 else None
    if signum is not None:
        try:
            return f"was killed by {signal.Signals(signum).name}"
        except ValueError:
            pass
    return f"exited with code {code}"
