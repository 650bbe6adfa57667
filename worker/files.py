"""Small files the worker keeps in its directory, written so a crash never leaves half a file, and a lock
that processes sharing a cache directory take turns on."""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def write_json(path: Path, payload: Any, *, private: bool = False) -> None:
    """Write ``payload`` as JSON to ``path`` atomically (a temporary file, then a rename).

    ``private`` makes the file readable by its owner only (it holds a token or a key). The temporary
    name carries the process id: the DHT's forked process may write the same file concurrently.
    """
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o666)
    with os.fdopen(fd, "w") as handle:
        json.dump(payload, handle)
    os.replace(tmp, path)


@contextmanager
def locked(path: Path, timeout_s: float, poll_s: float = 0.1) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the block.

    Processes that share a cache (workers of one machine, the import check) take turns on the same
    entry this way; the kernel drops the lock of a process that dies. Raises TimeoutError after
    ``timeout_s`` without the lock.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path} stayed locked for {timeout_s:g} s") from None
                time.sleep(poll_s)
        yield
    finally:
        os.close(fd)  # closing the only descriptor drops the lock
