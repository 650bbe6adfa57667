"""Where a worker's log is and how its tail is read: never more than the caller asked for.

Only the ``local`` launcher keeps worker logs on the orchestrator's disk (``<data_dir>/workers/
<request_id>.log``, its stdout and stderr). A worker joined by hand or launched on EC2 keeps its log on
its own machine: asking for it is a :class:`~orchestrator.errors.Conflict` whose message says where to
look instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import Conflict, NotFound

LOCAL_LAUNCHER = "local"
DEFAULT_TAIL_BYTES = 64 * 1024
MAX_TAIL_BYTES = 1024 * 1024

_ELSEWHERE = {
    "manual": "it joined by hand, so its log stays on its own machine",
    "ec2": "EC2 workers keep their log on their instance (docker logs spotswarm-worker, or the "
    "instance's console output); the orchestrator holds no copy",
}


@dataclass(frozen=True)
class LogTail:
    """The last bytes of a log, starting at a line boundary when it was cut."""

    size_bytes: int
    offset: int
    text: str

    next_offset: int  # where the bytes of ``text`` end: ask from here to follow the log

    @property
    def truncated(self) -> bool:
        return self.offset > 0


def local_log_path(data_dir: Path, request_id: str) -> Path:
    """The log the local launcher writes for ``request_id``."""
    return data_dir / "workers" / f"{request_id}.log"


def worker_log_path(data_dir: Path, worker_id: int, launcher: str, manual: bool, request_id: str) -> Path:
    """The file holding this worker's log; raises :class:`Conflict` when the orchestrator keeps none."""
    kind = "manual" if manual else launcher
    if kind != LOCAL_LAUNCHER:
        reason = _ELSEWHERE.get(kind, f"its launcher ({launcher}) keeps no log on the orchestrator")
        raise Conflict(f"no log of worker {worker_id} here: {reason}")
    return local_log_path(data_dir, request_id)


def read_tail(path: Path, tail_bytes: int) -> LogTail:
    """At most ``tail_bytes`` from the end of ``path``, minus a cut first line; NotFound if absent."""
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            offset = max(0, size - tail_bytes)
            handle.seek(max(0, offset - 1))
            before = handle.read(1) if offset > 0 else b"\n"  # the byte in front: is this a line start?
            data = handle.read(tail_bytes)
    except FileNotFoundError as exc:
        raise NotFound("the worker has written no log yet") from exc
    if before != b"\n":
        newline = data.find(b"\n")
        if 0 <= newline < len(data) - 1:  # drop the partial first line unless it is all there is
            offset += newline + 1
            data = data[newline + 1 :]
    return LogTail(size, offset, data.decode("utf-8", errors="replace"), offset + len(data))


def read_from(path: Path, offset: int, max_bytes: int) -> LogTail:
    """At most ``max_bytes`` of ``path`` from ``offset`` on (what a follower has not seen yet), ending at a
    line end when the chunk holds one, so a line and a UTF-8 character are never split between two
    answers; NotFound if absent."""
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            start = min(offset, size)
            handle.seek(start)
            data = handle.read(max_bytes)
    except FileNotFoundError as exc:
        raise NotFound("the worker has written no log yet") from exc
    newline = data.rfind(b"\n")
    if 0 <= newline < len(data) - 1:
        data = data[: newline + 1]
    return LogTail(size, start, data.decode("utf-8", errors="replace"), start + len(data))
