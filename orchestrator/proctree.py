"""The processes a server owns, read from Linux's ``/proc``: its descendants, their signals, its lifeline.

A stopping orchestrator must leave nothing of itself behind, yet leave alone what is meant to outlive it
(local workers survive an orchestrator restart). Its own processes are its descendants; a subtree can be
left out (:func:`descendants` ``prune``), e.g. a worker recognised by the environment marker its
launcher sets. A child that must end with the server, even one killed with SIGKILL, holds a lifeline
(:func:`exit_with_parent`). Linux only, like the local launcher (a PID's identity comes from
``/proc/<pid>/stat``).
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first, then the parent's PID,
    the process group, ... ``[19]`` the start time in clock ticks); None if the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    return raw[raw.rfind(")") + 2 :].split()


def proc_start_ticks(pid: int, include_zombies: bool = False) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or None if it is gone (or a zombie, by default).

    A PID alone does not identify a process for long (PIDs are reused); the pair (PID, start) does.
    """
    fields = stat_fields(pid)
    if fields is None or (fields[0] in ("Z", "X") and not include_zombies):
        return None
    return int(fields[19])


def parent_of(pid: int) -> int | None:
    """The parent PID of a live (not zombie) ``pid``; None if it is gone."""
    fields = stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[1])


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parent = parent_of(int(entry))
            if parent is not None:
                children.setdefault(parent, []).append(int(entry))
    return children


def descendants(root: int, prune: Callable[[int], bool] | None = None) -> list[int]:
    """Every live descendant of ``root`` (not ``root`` itself), parents before their children.

    A process for which ``prune`` says True is left out together with its whole subtree.
    """
    children = _children_by_parent()
    found: list[int] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop(0)
        if prune is not None and prune(pid):
            continue
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def command_name(pid: int) -> str:
    """The process's command name (``/proc/<pid>/comm``), or ``"?"`` if it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def has_env(pid: int, name: str) -> bool:
    """True if ``pid``'s environment (as it was exec'd) sets ``name``; False if unreadable or gone."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    prefix = name.encode() + b"="
    return any(item.startswith(prefix) for item in environ.split(b"\0"))


def signal_all(pids: Iterable[int], sig: signal.Signals) -> list[int]:
    """Send ``sig`` to each PID; returns those that were still there to receive it."""
    reached = []
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            continue
        reached.append(pid)
    return reached


def leave_with_children(exit_code: int) -> None:
    """End this process's descendants (SIGKILL), then this process at once, without cleanup."""
    signal_all(descendants(os.getpid()), signal.SIGKILL)
    os._exit(exit_code)


def exit_with_parent(parent_pid: int, exit_code: int = 0) -> threading.Thread:
    """Watch ``parent_pid`` from a daemon thread; when it exits, :func:`leave_with_children`.

    For a child that must not outlive its parent even when the parent is killed with SIGKILL. It waits on
    a pidfd (Linux 5.3+: wakes as the parent exits; elsewhere it checks every half second), so unlike the
    kernel's parent-death signal it works whichever of the parent's threads forked it, and does not wait
    for the child's main thread to run a signal handler (hivemind's event loop wakes every few seconds).
    Call it first thing in the child; a parent already gone (``getppid`` differs) ends the child at once.
    """

    def watch() -> None:
        try:
            pidfd = os.pidfd_open(parent_pid)
        except (AttributeError, OSError):  # no pidfd here, or the parent is gone already
            while os.getppid() == parent_pid:
                time.sleep(0.5)
        else:
            if os.getppid() == parent_pid:  # the pidfd is of our parent, not of a process that reused its PID
                select.select([pidfd], [], [])
        leave_with_children(exit_code)

    thread = threading.Thread(target=watch, name="exit-with-parent", daemon=True)
    thread.start()
    return thread
