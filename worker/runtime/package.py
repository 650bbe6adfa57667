"""A run's code package on a worker: check an archive, extract it safely, keep it cached by digest.

A package is a gzip-compressed tar of the user's project directory, made by ``spotswarm runs create
--workdir`` (``orchestrator/cli/packaging.py``) and addressed by the SHA-256 of its bytes, which the run spec
records (``RunSpec.workdir``). The format is fixed so that the same tree gives the same bytes: entries
sorted by path, regular files and symlinks only, mtimes :data:`FIXED_MTIME`, owner 0, modes 0644 or 0755.

Everything here refuses what could escape the extraction directory or fill a disk (absolute paths,
``..``, links that leave the tree, entries below a link or links through a link, devices, more than
``max_unpacked_bytes``) with :class:`UnsafePackage`, without trusting tarfile's ``data`` filter (which
Pythons without the CVE-2025-4517 fix let a crafted archive through); extraction itself goes entry by
entry into a new directory, links last, as a second line. The cache
(``<cache_dir>/packages/<digest>/``) is shared by the processes of a machine: one extracts while the others
wait on a lock, and a directory counts only once its ``.ready`` marker exists, so a crash half-way leaves
nothing that is used.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import posixpath
import re
import shutil
import stat
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from worker.files import locked

logger = logging.getLogger(__name__)

# 2000-01-01T00:00:00Z: any fixed time would do, but zip files (wheels built from the package) refuse
# times before 1980 in any time zone.
FIXED_MTIME = 946684800
DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")
MAX_MEMBERS = 100_000
PACKAGES_DIR = "packages"


class UnsafePackage(ValueError):
    """The archive is not a package this format allows (its message says which entry and why)."""


@dataclass(frozen=True)
class PackageInfo:
    """What an archive holds: its number of entries and the bytes they unpack to."""

    files: int
    unpacked_bytes: int


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _check_member(member: tarfile.TarInfo) -> None:
    name = member.name
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise UnsafePackage(f"entry {name!r}: only relative paths without '.', '..' or empty parts")
    if member.issym():
        target = member.linkname
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
        if not target or target.startswith("/") or resolved == ".." or resolved.startswith("../"):
            raise UnsafePackage(f"entry {name!r}: the link to {target!r} leaves the package")
    elif not (member.isfile() or member.isdir()):
        raise UnsafePackage(f"entry {name!r}: only files, directories and links inside the package")


def _check_tree(links: dict[str, str], names: dict[str, None]) -> None:
    """Refuse what makes a lexical check of each entry meaningless (CVE-2025-4517: tarfile's filter
    trusts ``os.path.realpath``, which stops resolving past PATH_MAX): an entry below a link entry (it
    would be written wherever the link points), and a link whose target walks through another link (its
    lexical resolution is then not where it points). ``links`` maps link entries to their targets."""
    for name in names:
        parent = name.rpartition("/")[0]
        while parent:
            if parent in links:
                raise UnsafePackage(f"entry {name!r} is below the link {parent!r}")
            parent = parent.rpartition("/")[0]
    for name, target in links.items():
        walked = name.rpartition("/")[0].split("/") if "/" in name else []
        steps = target.split("/")
        for index, step in enumerate(steps[:-1]):
            if step == "..":
                walked = walked[:-1]
            elif step not in ("", "."):
                walked.append(step)
                if "/".join(walked) in links:
                    raise UnsafePackage(
                        f"entry {name!r}: the link to {target!r} goes through the link "
                        f"{'/'.join(walked)!r} (step {index + 1})"
                    )


def inspect_archive(path: Path, max_unpacked_bytes: int) -> PackageInfo:
    """Check every entry of the package at ``path`` without extracting; raises :class:`UnsafePackage`.

    Each entry alone (a relative name, a file, directory or link whose target stays inside), then the
    entries together (no name twice, nothing below a link, no link through a link), so that the tree
    extracted is the tree these names describe, whatever the Python's tarfile does with links.
    """
    files = unpacked = 0
    links: dict[str, str] = {}
    names: dict[str, None] = {}  # in the archive's order, so that the first offender is named
    try:
        with tarfile.open(path, "r:gz") as archive:
            for member in archive:
                _check_member(member)
                if member.name in names:
                    raise UnsafePackage(f"entry {member.name!r} appears twice")
                names[member.name] = None
                if member.issym():
                    links[member.name] = member.linkname
                files += 1
                unpacked += member.size if member.isfile() else 0
                if files > MAX_MEMBERS:
                    raise UnsafePackage(f"more than {MAX_MEMBERS} entries")
                if unpacked > max_unpacked_bytes:
                    raise UnsafePackage(f"unpacks to more than {max_unpacked_bytes} bytes")
    except (tarfile.TarError, EOFError, OSError, zlib.error, gzip.BadGzipFile) as exc:
        raise UnsafePackage(f"not a gzip-compressed tar archive: {exc}") from exc
    _check_tree(links, names)
    return PackageInfo(files, unpacked)


def extract(path: Path, dest: Path, max_unpacked_bytes: int) -> PackageInfo:
    """Extract the package at ``path`` into the new directory ``dest``; raises :class:`UnsafePackage`.

    Entry by entry, not with ``extractall``: directories, then files created with ``O_EXCL |
    O_NOFOLLOW`` (never opened through a link), then the links, last, so that no write can pass
    through a link even if a check above were wrong. Modes are 0755 or 0644, as the packer writes them.
    """
    info = inspect_archive(path, max_unpacked_bytes)
    dest.mkdir(parents=True)
    links: list[tarfile.TarInfo] = []
    try:
        with tarfile.open(path, "r:gz") as archive:
            for member in archive:
                if member.issym():
                    links.append(member)
                elif member.isdir():
                    _make_dirs(dest, member.name)
                else:
                    _write_file(archive, member, dest)
        for link in links:
            _make_dirs(dest, posixpath.dirname(link.name))
            os.symlink(link.linkname, dest.joinpath(*link.name.split("/")))
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise UnsafePackage(f"cannot extract: {exc}") from exc
    return info


def _make_dirs(dest: Path, name: str) -> None:
    """Create the directory ``name`` and its parents below ``dest``, each refused if it is not a plain
    directory (no link can exist yet: links come last)."""
    current = dest
    for part in name.split("/") if name else []:
        current = current / part
        try:
            current.mkdir(mode=0o755)
        except FileExistsError:
            if not stat.S_ISDIR(current.lstat().st_mode):
                raise UnsafePackage(f"entry {name!r}: {part!r} is not a directory") from None


def _write_file(archive: tarfile.TarFile, member: tarfile.TarInfo, dest: Path) -> None:
    """Write the file entry ``member`` as a new file (refused if anything is there already)."""
    _make_dirs(dest, posixpath.dirname(member.name))
    source = archive.extractfile(member)
    if source is None:
        raise UnsafePackage(f"entry {member.name!r}: no data")
    mode = 0o755 if member.mode & 0o111 else 0o644
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_BINARY", 0)
    descriptor = os.open(dest.joinpath(*member.name.split("/")), flags, mode)
    with source, os.fdopen(descriptor, "wb") as out:
        os.fchmod(out.fileno(), mode)  # whatever the umask took away
        shutil.copyfileobj(source, out, 1 << 20)


def ensure_package(
    cache_dir: Path,
    digest: str,
    fetch: Callable[[Path], object],
    max_unpacked_bytes: int,
    lock_timeout_s: float = 600.0,
) -> tuple[Path, bool]:
    """The extracted package ``digest`` under ``cache_dir`` and whether it was there already.

    When it is not cached, ``fetch(dest)`` writes the archive to ``dest``; its SHA-256 must be
    ``digest`` (else :class:`UnsafePackage`: nothing is kept). Raises TimeoutError when another process
    holds the entry for longer than ``lock_timeout_s``.
    """
    if not DIGEST_RE.match(digest):
        raise UnsafePackage(f"package digest {digest!r} is not a hex SHA-256")
    root = cache_dir / PACKAGES_DIR
    final, ready = root / digest, root / f"{digest}.ready"
    with locked(root / f"{digest}.lock", lock_timeout_s):
        if ready.exists():
            return final, True
        shutil.rmtree(final, ignore_errors=True)  # what a crashed extraction left
        archive = root / f".{digest}.tar.gz.part"
        try:
            fetch(archive)
            actual = sha256_of(archive)
            if actual != digest:
                raise UnsafePackage(f"package bytes have sha256 {actual}, the run names {digest}")
            info = extract(archive, final, max_unpacked_bytes)
        except BaseException:
            shutil.rmtree(final, ignore_errors=True)
            raise
        finally:
            archive.unlink(missing_ok=True)
        ready.touch()
    logger.info("package %s: %d entries, %d bytes in %s", digest[:12], info.files, info.unpacked_bytes, final)
    return final, False
