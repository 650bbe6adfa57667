"""Waiting on a condition or a file with a deadline (never a bare sleep), checking that a condition holds
for a while (what must not happen, watched instead of slept through), and how long a process that
imports torch, Lightning and hivemind may take to boot."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

#: Seconds a worker, agent or peer process may take from its start to training: importing torch,
#: Lightning and hivemind (and joining a swarm) on a busy 2-core machine.
BOOT_S = 180.0


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float,
    interval_s: float = 0.2,
    message: str | Callable[[], str] = "",
) -> T:
    """Poll ``predicate`` until it returns something truthy and return that; fail after ``timeout_s``.

    Exceptions raised by the predicate count as "not yet" and the last one is shown on time-out. A
    callable ``message`` is called only then, so that it can show a process's log as it is at the end.
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
            said = message() if callable(message) else message
            raise TimeoutError(f"condition not met within {timeout_s:.0f} s: {said}{detail}")
        time.sleep(interval_s)


def wait_for_file(path: Path, timeout_s: float, poll_s: float = 0.05) -> Path:
    """Return ``path`` once it exists (another process writes it atomically); raise TimeoutError after
    ``timeout_s``. Used where processes hand each other addresses or a go signal through files."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s:g} s")
        time.sleep(poll_s)
    return path


def holds_for(predicate: Callable[[], object], duration_s: float, message: str, poll_s: float = 0.02) -> None:
    """Check ``predicate`` every ``poll_s`` for ``duration_s`` and fail (AssertionError with ``message``) as
    soon as it is false: for what must *not* happen within a window (a process that must not be stopped
    yet), watched the whole time instead of slept through and checked once at the end."""
    deadline = time.monotonic() + duration_s
    while True:
        assert predicate(), f"{message} (failed after {duration_s - (deadline - time.monotonic()):.2f} s)"
        if time.monotonic() >= deadline:
            return
        time.sleep(poll_s)
