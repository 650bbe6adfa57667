"""Checkpoints as files under a directory: ``<root>/<key>``, made visible by an atomic rename.

``put_file`` copies the verified upload into a hidden temporary file next to its destination, fsyncs
it and renames it over the destination, so a reader sees the old file or the whole new one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from orchestrator.storage.base import CheckpointNotFound

logger = logging.getLogger(__name__)


class LocalCheckpointStore:
    """:class:`~orchestrator.storage.base.CheckpointStore` on the local file system."""

    name = "local"

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def path_of(self, key: str) -> Path:
        """The file of ``key``; raises ValueError for an empty, absolute or escaping key."""
        parts = key.split("/")
        if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"invalid checkpoint key {key!r}")
        return self.root.joinpath(*parts)

    def put_file(self, key: str, path: Path, sha256: str) -> None:
        """Copy ``path`` to ``key`` atomically (the caller verified ``sha256``). Raises OSError."""
        dest = self.path_of(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
        try:
            with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp_name, dest)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
        logger.info("stored checkpoint %s (sha256 %s)", key, sha256[:12])

    def open_stream(self, key: str, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
        """Yield the file's bytes; raises :class:`CheckpointNotFound` (at once, before the first chunk)."""
        try:
            handle = open(self.path_of(key), "rb")  # noqa: SIM115 - closed by the generator
        except FileNotFoundError as exc:
            raise CheckpointNotFound(key) from exc
        return _chunks(handle, chunk_bytes)

    def size(self, key: str) -> int:
        try:
            return self.path_of(key).stat().st_size
        except FileNotFoundError as exc:
            raise CheckpointNotFound(key) from exc

    def delete(self, key: str) -> None:
        self.path_of(key).unlink(missing_ok=True)

    def stored_since(self, under: str) -> dict[str, datetime]:
        """Files whose key starts with ``under`` and their modification times (hidden ``.part`` files of
        writes in progress left out)."""
        found: dict[str, datetime] = {}
        for path in self.root.joinpath(under.rpartition("/")[0]).rglob("*"):
            key = path.relative_to(self.root).as_posix()
            if key.startswith(under) and not path.name.startswith(".") and path.is_file():
                with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                    found[key] = datetime.fromtimestamp(path.stat().st_mtime, UTC)
        return found


def _chunks(handle: BinaryIO, chunk_bytes: int) -> Iterator[bytes]:
    with handle:
        while chunk := handle.read(chunk_bytes):
            yield chunk
