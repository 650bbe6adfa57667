"""The processes a server owns, read from Linux's ``/proc``: its descendants, their signals, its lifeline.

A stopping orchestrator must leave nothing of itself behind, yet leave alone what is meant to outlive it
(local workers survive an orchestrator restart). Its own processes are its descendants; a subtree can be
left out (:func:`descendants` ``prune``), e.g. a worker recognised by the environment marker its
launcher sets. A child that must end with the server, even one killed with SIGKILL, holds a lifeline
(:func:`exit_with_parent`). Linux only, like the local launcher (a PID's identity comes from
``/proc/<pid>/stat``).
"""

from __future__ import annotations

from pathlib import Path

from worker.runtime.lifeline import (
    descendants,
    exit_with_parent,
    leave_with_children,
    parent_of,
    signal_all,
    stat_fields,
)

__all__ = [
    "COMM_MAX_BYTES",
    "command_name",
    "descendants",
    "exit_with_parent",
    "has_env",
    "leave_with_children",
    "parent_of",
    "proc_start_ticks",
    "runs_command",
    "signal_all",
    "stat_fields",
]


def proc_start_ticks(pid: int, include_zombies: bool = False) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or None if it is gone (or a zombie, by default).

    A PID alone does not identify a process for long (PIDs are reused); the pair (PID, start) does.
    """
    fields = stat_fields(pid)
    if fields is None or (fields[0] in ("Z", "X") and not include_zombies):
        return None
    return int(fields[19])


def command_name(pid: int) -> str:
    """The process's command name (``/proc/<pid>/comm``), or ``"?"`` if it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


#: Linux keeps a process's command name (``comm``) to its first 15 bytes (TASK_COMM_LEN 16, with the NUL)
COMM_MAX_BYTES = 15


def runs_command(pid: int, name: str) -> bool:
    """True if ``pid`` runs the program called ``name``, as Linux keeps that name (its first 15 bytes:
    ``torch_shm_manager`` reads as ``torch_shm_manag``)."""
    return command_name(pid) == name.encode()[:COMM_MAX_BYTES].decode(errors="ignore")


def has_env(pid: int, name: str) -> bool:
    """True if ``pid``'s environment (as it was exec'd) sets ``name``; False if unreadable or gone."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    prefix = name.encode() + b"="
    return any(item.startswith(prefix) for item in environ.split(b"\0"))
