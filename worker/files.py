"""Small files the worker keeps in its directory, written so a crash never leaves half a file, and a wait for
a file another process writes."""

from __future__ import annotations

import json
import os
import time
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


def wait_for_file(path: Path, timeout_s: float, poll_s: float = 0.05) -> Path:
    """Return ``path`` once it exists (another process writes it atomically); raise TimeoutError after
    ``timeout_s``. Used where processes hand each other addresses or a go signal through files."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s:g} s")
        time.sleep(poll_s)
    return path
