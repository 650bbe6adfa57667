"""Packing a project directory into a run's code package (``spotswarm runs create --workdir DIR``).

What goes in: every file under the directory except what its ignore files leave out, with git's rules
(the ``pathspec`` library implements them; hand-written matching gets negation and directory patterns
wrong): ``.gitignore`` files at any depth, then ``.spotswarmignore`` at the top (which can also re-include
with ``!``), over built-in defaults (``.git/``, ``.venv/``, ``__pycache__/``, ``*.pyc``). An ignored
directory is not entered. Links stay links when they point inside the directory, and are refused
otherwise; anything but files, directories and links is refused.

Secrets stay out unless asked for (``include_secrets``): an orchestrator's data dir (a directory holding
one of :data:`DATA_DIR_MARKERS`: its admin token, swarm authority key, DHT identity, database, workers'
keys) is left out whole, and so is every file whose name looks like a key, a token, an environment
file or our database (:func:`secret_reason`), because a ``--workdir`` one directory too high would
otherwise ship them to every worker. What was left out is returned with the reason, for the CLI to say.

The archive is deterministic (see :mod:`worker.runtime.package`: sorted entries, fixed times, owners and
modes, no name or time in the gzip header), so the same tree gives the same SHA-256 and is uploaded
once. A tree bigger than the cap is refused with its biggest files named: it usually holds data or an
environment that should be ignored.
"""

from __future__ import annotations

import fnmatch
import gzip
import os
import re
import stat
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pathspec

from worker.runtime.package import FIXED_MTIME, sha256_of

IGNORE_FILE = ".spotswarmignore"
DEFAULT_IGNORES = (".git/", ".venv/", "__pycache__/", "*.py[cod]", ".DS_Store")
BIGGEST_SHOWN = 5
#: files only an orchestrator's data dir holds (``orchestrator/config.py``): a directory with one of them is
#: a data dir, left out whole
DATA_DIR_MARKERS = ("admin_token", "swarm_authority.pem", "dht_identity.key", "dht.pid")
#: names of keys, credentials, environment files and our databases (a worker's registration holds its
#: run's secret values), matched case-insensitively against a file's name
SECRET_NAMES = (
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.jks",
    ".env",
    ".env.*",
    "*.env",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    ".netrc",
    ".pypirc",
    ".git-credentials",
    "credentials",
    "credentials.json",
    "registration.json",
    "spotswarm.db",
    "spotswarm.db-*",
)
#: "token" in a name, except a tokenizer's files (``tokenizer.json``, ``special_tokens_map.json``) and code
TOKEN_RE = re.compile(r"token(?!i[sz]|s)", re.IGNORECASE)
CODE_SUFFIXES = (".py", ".pyi", ".ipynb")
#: templates that hold no values (``.env.example``)
TEMPLATE_SUFFIXES = (".example", ".sample", ".template", ".dist")


class PackagingError(ValueError):
    """The directory cannot be packed as it is; the message says which file and what to do."""


@dataclass(frozen=True)
class Entry:
    """A file or link of the package: its path inside, and its file (or link target) on disk."""

    name: str
    path: Path
    size: int
    link: str | None = None


@dataclass(frozen=True)
class LeftOut:
    """A file or directory kept out of the package because it looks secret, and why."""

    name: str
    reason: str


@dataclass(frozen=True)
class Contents:
    """What a directory's package holds, and what was kept out of it as secret."""

    entries: list[Entry]
    left_out: list[LeftOut]


@dataclass(frozen=True)
class Package:
    """A packed project: the archive written, its SHA-256 and what it holds."""

    archive: Path
    sha256: str
    size_bytes: int
    files: int
    unpacked_bytes: int
    entries: list[Entry]
    left_out: list[LeftOut]


def data_dir_marker(directory: Path) -> str | None:
    """The marker file that makes ``directory`` an orchestrator's data dir, or None."""
    return next((name for name in DATA_DIR_MARKERS if (directory / name).is_file()), None)


def secret_reason(name: str) -> str | None:
    """Why a file named ``name`` looks like a secret (a key, token, credential, environment file or our
    database), or None."""
    lowered = name.lower()
    if lowered.endswith(TEMPLATE_SUFFIXES):
        return None
    pattern = next((p for p in SECRET_NAMES if fnmatch.fnmatchcase(lowered, p)), None)
    if pattern is not None:
        return f"matches {pattern}"
    if TOKEN_RE.search(name) and not lowered.endswith(CODE_SUFFIXES):
        return "its name says token"
    return None


class _Rules:
    """The ignore rules in force in one directory: (base directory, spec) pairs, outermost first."""

    def __init__(self, layers: Sequence[tuple[str, pathspec.PathSpec]]) -> None:
        self.layers = list(layers)

    def nested(self, rel_dir: str, directory: Path) -> _Rules:
        gitignore = directory / ".gitignore"
        if rel_dir and gitignore.is_file():
            return _Rules([*self.layers, (rel_dir, _spec(gitignore))])
        return self

    def ignored(self, rel: str, is_dir: bool) -> bool:
        """Git's answer: the last pattern that matches decides (a ``!`` pattern re-includes)."""
        decision = False
        for base, spec in self.layers:
            if base and not rel.startswith(base + "/"):
                continue
            inner = rel[len(base) + 1 :] if base else rel
            result = spec.check_file(inner + "/" if is_dir else inner)
            if result.include is not None:
                decision = result.include
        return decision


def _spec(path: Path) -> pathspec.PathSpec:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        raise PackagingError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return pathspec.GitIgnoreSpec.from_lines(lines)


def _root_rules(root: Path) -> _Rules:
    layers: list[tuple[str, pathspec.PathSpec]] = [("", pathspec.GitIgnoreSpec.from_lines(DEFAULT_IGNORES))]
    layers.extend(("", _spec(root / name)) for name in (".gitignore", IGNORE_FILE) if (root / name).is_file())
    return _Rules(layers)


def collect(root: Path, include_secrets: bool = False) -> Contents:
    """The entries of the package of ``root``, sorted by name, and what was left out as secret (nothing
    with ``include_secrets``); raises :class:`PackagingError`."""
    root = root.resolve()
    if not root.is_dir():
        raise PackagingError(f"workdir {root} is not a directory")
    entries: list[Entry] = []
    left_out: list[LeftOut] = []
    pending = [("", root, _root_rules(root))]
    while pending:
        rel_dir, directory, rules = pending.pop()
        marker = None if include_secrets else data_dir_marker(directory)
        if marker is not None:
            left_out.append(LeftOut(f"{rel_dir or '.'}/", f"an orchestrator's data dir (it holds {marker})"))
            continue
        rules = rules.nested(rel_dir, directory)
        for child in sorted(directory.iterdir()):
            rel = f"{rel_dir}/{child.name}" if rel_dir else child.name
            mode = child.lstat().st_mode
            if rules.ignored(rel, stat.S_ISDIR(mode)):
                continue
            reason = None if include_secrets or stat.S_ISDIR(mode) else secret_reason(child.name)
            if reason is not None:
                left_out.append(LeftOut(rel, f"looks like a secret ({reason})"))
            elif stat.S_ISLNK(mode):
                entries.append(_link(root, rel, child))
            elif stat.S_ISDIR(mode):
                pending.append((rel, child, rules))
            elif stat.S_ISREG(mode):
                entries.append(Entry(rel, child, child.lstat().st_size))
            else:
                raise PackagingError(f"{rel} is not a file, directory or link: add it to {IGNORE_FILE}")
    return Contents(sorted(entries, key=lambda e: e.name), sorted(left_out, key=lambda e: e.name))


def _link(root: Path, rel: str, path: Path) -> Entry:
    """A link kept as a relative link; refused when it points outside ``root``."""
    target = Path(os.path.normpath(path.parent / os.readlink(path)))
    if not target.resolve().is_relative_to(root):
        raise PackagingError(
            f"{rel} links to {os.readlink(path)}, outside the workdir: copy the file in, or add the link "
            f"to {IGNORE_FILE}"
        )
    return Entry(rel, path, 0, link=os.path.relpath(target, path.parent))


def pack(root: Path, dest_dir: Path, max_unpacked_bytes: int, include_secrets: bool = False) -> Package:
    """Write the package of ``root`` into ``dest_dir``, secrets left out unless ``include_secrets``;
    raises :class:`PackagingError` (too big, a link leaving the tree, an unreadable file)."""
    contents = collect(root, include_secrets)
    entries = contents.entries
    total = sum(e.size for e in entries)
    if total > max_unpacked_bytes:
        biggest = sorted(entries, key=lambda e: e.size, reverse=True)[:BIGGEST_SHOWN]
        shown = ", ".join(f"{e.name} ({_mib(e.size)})" for e in biggest)
        raise PackagingError(
            f"workdir {root} holds {_mib(total)} to ship, over the {_mib(max_unpacked_bytes)} limit; the "
            f"biggest files: {shown}. Leave data and environments out with {IGNORE_FILE} (gitignore "
            "syntax) or .gitignore, or raise the limit with --workdir-max-mib"
        )
    archive = dest_dir / "package.tar.gz"
    try:
        with (
            archive.open("wb") as raw,
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as zipped,
            tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for entry in entries:
                _add(tar, entry)
    except OSError as exc:
        raise PackagingError(f"cannot pack {root}: {exc}") from exc
    size = archive.stat().st_size
    return Package(archive, sha256_of(archive), size, len(entries), total, entries, contents.left_out)


def _add(tar: tarfile.TarFile, entry: Entry) -> None:
    info = tarfile.TarInfo(entry.name)
    info.mtime, info.uid, info.gid, info.uname, info.gname = FIXED_MTIME, 0, 0, "", ""
    if entry.link is not None:
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, entry.link, 0o777
        tar.addfile(info)
        return
    info.size = entry.size
    info.mode = 0o755 if entry.path.stat().st_mode & 0o111 else 0o644
    with entry.path.open("rb") as handle:
        tar.addfile(info, handle)


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"
