"""Top-level names a run's code package may not ship: ``worker`` and ``orchestrator`` are spotswarm's own.

spotswarm's two packages are imported where a run's code is checked and run: the worker agent is
``worker`` and imports the run's classes from inside it, and the create-time check runs in the server's
fork server, which has ``orchestrator`` imported. Python imports a top-level name once per process, so a
run's own ``worker`` or ``orchestrator`` would never be imported there: ``import worker.model`` looks into
spotswarm's package and fails with "No module named", far from the cause. A run whose package ships a
top-level package or module of either name is therefore refused when it is created, naming the entry and
what to rename (:func:`check_package_names`), whether or not the server checks the run's imports.

What counts: a module file at the top (``worker.py``, ``worker.pyc``, an extension module), a file of
Python code anywhere below a top-level ``worker/`` directory (a package, namespace packages included), or a
top-level link of either name (it may point to one). A ``worker/`` directory of data files alone is fine:
nothing imports it.
"""

from __future__ import annotations

import gzip
import io
import tarfile
import zlib
from collections.abc import Iterable, Iterator

from orchestrator.errors import InvalidRequest
from orchestrator.storage.base import CheckpointStore

#: spotswarm's own top-level packages, which a run's code cannot share a name with
RESERVED_NAMES = ("worker", "orchestrator")
#: files Python imports as modules (extension modules carry more before the last suffix)
_SOURCE_SUFFIXES = (".py", ".pyc")
_EXTENSION_SUFFIXES = (".so", ".pyd")


def reserved_name_problem(entries: Iterable[tuple[str, str]]) -> str | None:
    """What is wrong with a package of these entries (``(path, kind)``, kind ``file``, ``dir`` or
    ``link``), or None: the first entry that makes a top-level package or module of a reserved name."""
    for path, kind in entries:
        for reserved in RESERVED_NAMES:
            what = _ships(reserved, path, kind)
            if what:
                return _refusal(what, reserved, path)
    return None


def _refusal(what: str, reserved: str, path: str) -> str:
    return (
        f"workdir: the package ships a top-level {what} {reserved!r} ({path}), a name spotswarm's own code "
        "takes (the worker agent runs inside spotswarm's 'worker' package, the create-time check inside "
        f"'orchestrator'), so the run's {reserved!r} would never be imported; rename it, to your project's "
        "name for example, and the import paths that name it"
    )


def _ships(reserved: str, path: str, kind: str) -> str | None:
    """``"package"`` or ``"module"`` when the entry makes ``reserved`` importable, else None."""
    top, _, below = path.partition("/")
    if below:
        return "package" if top == reserved and kind != "dir" and _is_code(below) else None
    if top == reserved:
        return "package" if kind == "link" else None  # a directory alone: its code, if any, says
    if top in (reserved + suffix for suffix in _SOURCE_SUFFIXES):
        return "module"
    return "module" if top.startswith(f"{reserved}.") and top.endswith(_EXTENSION_SUFFIXES) else None


def _is_code(path: str) -> bool:
    name = path.rpartition("/")[2]
    return name.endswith(_SOURCE_SUFFIXES) or name.endswith(_EXTENSION_SUFFIXES)


def check_package_names(store: CheckpointStore, key: str) -> None:
    """Raise :class:`InvalidRequest` when the package stored under ``key`` ships a reserved top-level name
    (or cannot be read as one); reads the archive once, as a stream, without extracting it."""
    chunks = store.open_stream(key)
    try:
        problem = reserved_name_problem(_entries(chunks))
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise InvalidRequest(f"workdir: the stored package cannot be read: {exc}") from exc
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    if problem:
        raise InvalidRequest(problem)


def _entries(chunks: Iterator[bytes]) -> Iterator[tuple[str, str]]:
    """``(path, kind)`` of each entry of the gzip-compressed tar arriving in ``chunks``."""
    with tarfile.open(fileobj=io.BufferedReader(_ChunkReader(chunks)), mode="r|gz") as archive:
        for member in archive:
            kind = "dir" if member.isdir() else "link" if member.issym() or member.islnk() else "file"
            yield member.name, kind


class _ChunkReader(io.RawIOBase):
    """A readable stream over an iterator of byte chunks (a store's ``open_stream``)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = chunk
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size
