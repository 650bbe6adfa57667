"""Large uploads (checkpoints, code packages): a disk-space check before any byte is read, then the body
streamed to a temporary file under ``<data_dir>/tmp`` while its size is capped and its SHA-256 computed.
Only what arrives whole and matches its checksum goes on to the store; the temporary file never outlives
the request."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
from fastapi import Request

from orchestrator.config import Settings
from orchestrator.errors import ChecksumMismatch, InsufficientStorage, PayloadTooLarge


@dataclass(frozen=True)
class Received:
    """An upload on disk: where, how many bytes, their SHA-256."""

    path: Path
    size: int
    sha256: str


def upload_dir(settings: Settings) -> Path:
    path = settings.data_dir / "tmp"
    path.mkdir(parents=True, exist_ok=True)
    return path


def declared_size(request: Request, default: int) -> int:
    """The request's Content-Length, or ``default`` when it sends none (chunked)."""
    declared = request.headers.get("content-length", "")
    return int(declared) if declared.isdigit() else default


def check_free_space(settings: Settings, size_bytes: int) -> None:
    """Raise :class:`InsufficientStorage` unless the upload dir keeps ``checkpoint_min_free_bytes`` free
    after ``size_bytes`` more."""
    needed = size_bytes + settings.checkpoint_min_free_bytes
    free = shutil.disk_usage(upload_dir(settings)).free
    if free < needed:
        raise InsufficientStorage(
            f"only {free} bytes free for uploads, {needed} needed (the upload and "
            f"{settings.checkpoint_min_free_bytes} kept free); retry later"
        )


@asynccontextmanager
async def received(
    request: Request, settings: Settings, max_bytes: int, sha256: str, what: str
) -> AsyncIterator[Received]:
    """The body in a temporary file, removed when the block ends. Raises :class:`PayloadTooLarge` past
    ``max_bytes`` and :class:`ChecksumMismatch` when its SHA-256 is not ``sha256``."""
    fd, tmp_name = tempfile.mkstemp(prefix="upload-", suffix=".part", dir=upload_dir(settings))
    path = Path(tmp_name)
    try:
        digest, size = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as handle:
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise PayloadTooLarge(f"{what} larger than {max_bytes} bytes")
                digest.update(chunk)
                await anyio.to_thread.run_sync(handle.write, chunk)
        if digest.hexdigest() != sha256:
            raise ChecksumMismatch(f"body sha256 is {digest.hexdigest()}, expected {sha256}")
        yield Received(path, size, sha256)
    finally:
        path.unlink(missing_ok=True)
