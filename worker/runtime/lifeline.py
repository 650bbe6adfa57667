"""A child process's lifeline: it ends, with everything it started, as soon as its parent is gone.

hivemind's DHT is a forked process that runs ``p2pd`` as its own child. Killed with SIGKILL, the process
that started it (a worker agent, a server) can run no cleanup, and the DHT and ``p2pd`` would live on with
parent 1, holding ports and announcing a peer that no longer trains. The child calls
:func:`exit_with_parent` first thing; the worker's DHT does (``worker/strategy/dht.py LifelineDHT``), and so
does the orchestrator's (``orchestrator/processes.py`` reads its process tree with these functions).
Linux only: processes are read from ``/proc``.
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


def exit_with_parent(parent_pid: int, exit_code: int = 0, *, keep_children: bool = False) -> threading.Thread:
    """Watch ``parent_pid`` from a daemon thread; when it exits, :func:`leave_with_children` (or, with
    ``keep_children``, exit alone: for a process whose children are meant to outlive it).

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
        if keep_children:
            os._exit(exit_code)
        leave_with_children(exit_code)

    thread = threading.Thread(target=watch, name="exit-with-parent", daemon=True)
    thread.start()
    return thread


_forks_hold_lifeline = False


def forked_children_exit_with_parent(exit_code: int = 1) -> None:
    """From now on every child this process forks (hivemind's DHT and averagers, DataLoader workers) holds
    a lifeline to it (:func:`exit_with_parent`). Idempotent. Processes started with ``subprocess`` (fork
    then exec) are not concerned: they run no Python code of ours; ``p2pd`` ends with the DHT.
    """
    global _forks_hold_lifeline
    if _forks_hold_lifeline:
        return
    _forks_hold_lifeline = True
    os.register_at_fork(after_in_child=lambda: exit_with_parent(os.getppid(), exit_code))
