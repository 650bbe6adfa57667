"""The checkpoint store interface. Keys look like ``runs/<swarm_id>/epoch-00000012-<sha256>.ckpt``; runs'
code packages share the store as ``packages/<sha256>.tar.gz``.

The API layer receives an upload into a temporary file, verifies its size and SHA-256, and only then
calls :meth:`CheckpointStore.put_file`, which must make the object visible atomically: a reader sees
the old state or the whole new object, never a part. ``open_stream`` verifies nothing; callers that need
integrity compare the recorded checksum.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Protocol, runtime_checkable


class CheckpointNotFound(KeyError):
    """No object is stored under the key."""


class CheckpointCorrupt(ValueError):
    """The stored bytes do not match the recorded checksum or size."""


@runtime_checkable
class CheckpointStore(Protocol):
    name: str

    def put_file(self, key: str, path: Path, sha256: str) -> None:
        """Store the verified file at ``path`` under ``key``, atomically."""
        ...

    def open_stream(self, key: str, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
        """Yield the object's bytes; raises :class:`CheckpointNotFound`."""
        ...

    def size(self, key: str) -> int:
        """Size in bytes; raises :class:`CheckpointNotFound`."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object; a no-op when it is absent."""
        ...

    def stored_since(self, under: str) -> dict[str, datetime]:
        """The keys that start with ``under`` and when each was stored (aware, UTC): what the sweep of
        packages no run names reads."""
        ...


def checkpoint_key(swarm_id: str, epoch: int, sha256: str | None = None) -> str:
    """The storage key of a run's checkpoint at ``epoch``; with ``sha256``, of those very bytes.

    Uploads use the checksum in the key, so two concurrent uploads of one epoch with different bytes
    write different objects: the one that loses the race in the database cannot overwrite the winner's.
    """
    suffix = f"-{sha256}" if sha256 else ""
    return f"runs/{swarm_id}/epoch-{epoch:08d}{suffix}.ckpt"


PACKAGES_PREFIX = "packages/"


def package_key(sha256: str) -> str:
    """The storage key of the code package whose bytes have this SHA-256 (content-addressed: one object
    for every run that names it)."""
    return f"{PACKAGES_PREFIX}{sha256}.tar.gz"


def copy_to_file(store: CheckpointStore, key: str, dest: Path) -> None:
    """Write the object ``key`` to ``dest`` (replaced). Raises :class:`CheckpointNotFound`, and whatever
    the store raises for bad bytes (S3: :class:`CheckpointCorrupt`)."""
    with dest.open("wb") as handle:
        for chunk in store.open_stream(key):
            handle.write(chunk)
