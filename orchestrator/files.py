"""Small files the orchestrator writes whole (the local launcher's state files, the admin token, the swarm
authority's key, the DHT peer's pid file), so that a reader or a crash never meets half of one.

One way for all of them: the bytes go to a temporary file beside the target (mode 0600 when ``private``:
it holds a secret), which then replaces the target (:func:`write_atomic`) or is linked to its name only if
no file has it yet (:func:`create_atomic`). Streamed files (uploads, downloads) have their own code.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


def write_atomic(path: Path, data: str | bytes, *, private: bool = False) -> None:
    """Replace ``path`` with ``data``: a reader sees the old file or the new one, never a part."""
    tmp = _written(path, data, private)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def create_atomic(path: Path, data: str | bytes, *, private: bool = False) -> bool:
    """Create ``path`` holding ``data`` unless it exists; returns False (and writes nothing) when it does.

    Of processes creating the same file at once, exactly one succeeds; nobody ever reads it half written.
    """
    tmp = _written(path, data, private)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    return True


def _written(path: Path, data: str | bytes, private: bool) -> Path:
    """A temporary file beside ``path`` holding ``data``; its name is this process's and thread's own."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o666)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data.encode() if isinstance(data, str) else data)
    return tmp
