"""The run's code and environment in ``spotswarm runs create``: ``--workdir`` (packed and uploaded once),
``--requirement``/``--requirements-file``, ``--env`` and ``--secret-env``.

``workdir`` in a spec file is a directory (relative to the file) or, as ``runs show --json`` prints it, the
SHA-256 of a package the orchestrator has. Secret values never come back from the API: a spec read back
names its secrets with null values, and ``--secret-env NAME`` (the value from your environment) or
``--secret-env NAME=VALUE`` gives them again.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import click

from orchestrator.cli.client import ApiClient, CliError
from orchestrator.cli.packaging import PackagingError, pack

F = TypeVar("F", bound=Callable[..., Any])
DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")
USAGE = 2


def code_options(func: F) -> F:
    """The flags of this module on ``runs create``."""
    decorated: Any = func
    for option in reversed(_OPTIONS):
        decorated = option(decorated)
    return cast(F, decorated)


_OPTIONS = [
    click.option(
        "--workdir",
        metavar="DIR",
        help="Ship this project directory with the run: packed (without what .gitignore and "
        ".spotswarmignore leave out), uploaded once, and imported by every worker from these very bytes.",
    ),
    click.option(
        "--workdir-max-mib",
        type=click.IntRange(1),
        default=100,
        show_default=True,
        help="Refuse a workdir holding more than this (MiB).",
    ),
    click.option(
        "--requirement",
        multiple=True,
        metavar="SPEC",
        help="Installed on every worker into the run's environment: a requirements-file line, e.g. "
        "'einops>=0.7' (repeatable).",
    ),
    click.option("--requirements-file", metavar="PATH", help="A requirements file inside --workdir."),
    click.option("--env", multiple=True, metavar="NAME=VALUE", help="Environment variable of the run."),
    click.option(
        "--secret-env",
        multiple=True,
        metavar="NAME[=VALUE]",
        help="Secret environment variable (never shown again): NAME takes the value from your environment.",
    ),
]


def apply_code_flags(
    spec: dict[str, Any],
    flags: dict[str, Any],
    spec_dir: Path,
    api: ApiClient,
    say: Callable[[str], None],
) -> None:
    """Fill ``spec``'s ``workdir``, ``requirements``, ``env`` and ``secret_env`` from the flags (which win
    over the spec file), packing and uploading a workdir directory. Raises :class:`CliError`."""
    workdir_dir = _workdir_dir(spec, flags, spec_dir)
    if flags.get("requirement"):
        spec["requirements"] = [*(spec.get("requirements") or []), *flags["requirement"]]
    if flags.get("requirements_file"):
        spec["requirements"] = [*(spec.get("requirements") or []), _requirements_line(flags, workdir_dir)]
    if flags.get("env"):
        spec["env"] = {**(spec.get("env") or {}), **_env_pairs(flags["env"])}
    if flags.get("secret_env"):
        spec["secret_env"] = {**(spec.get("secret_env") or {}), **_secret_pairs(flags["secret_env"])}
    if workdir_dir is not None:
        spec["workdir"] = upload_workdir(api, workdir_dir, flags.get("workdir_max_mib") or 100, say)


def _workdir_dir(spec: dict[str, Any], flags: dict[str, Any], spec_dir: Path) -> Path | None:
    """The directory to pack, if the flag or the spec file names one (not a digest)."""
    if flags.get("workdir"):
        return Path(flags["workdir"]).expanduser()
    value = spec.get("workdir")
    if not isinstance(value, str):
        return None
    path = (spec_dir / value).expanduser()
    if DIGEST_RE.match(value) and not path.is_dir():
        return None  # a package the orchestrator stores (a spec read back from the API)
    return path


def _requirements_line(flags: dict[str, Any], workdir_dir: Path | None) -> str:
    """``-r FILE`` for a requirements file of the package; it must be there (and not ignored)."""
    name = flags["requirements_file"]
    if workdir_dir is None:
        raise CliError("--requirements-file names a file inside the workdir: give --workdir DIR too", USAGE)
    path = (workdir_dir / name).resolve()
    if not path.is_file() or not path.is_relative_to(workdir_dir.resolve()):
        raise CliError(f"--requirements-file {name}: no such file inside the workdir {workdir_dir}", USAGE)
    return f"-r {path.relative_to(workdir_dir.resolve()).as_posix()}"


def _env_pairs(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise CliError(f"--env expects NAME=VALUE, got {pair!r}", USAGE)
        out[name] = value
    return out


def _secret_pairs(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not name:
            raise CliError(f"--secret-env expects NAME or NAME=VALUE, got {pair!r}", USAGE)
        if not sep:
            if name not in os.environ:
                raise CliError(f"--secret-env {name}: not in your environment (give {name}=VALUE)", USAGE)
            value = os.environ[name]
        out[name] = value
    return out


def upload_workdir(api: ApiClient, directory: Path, max_mib: int, say: Callable[[str], None]) -> str:
    """Pack ``directory``, upload the package unless the orchestrator has it, and return its SHA-256."""
    with tempfile.TemporaryDirectory(prefix="spotswarm-package-") as tmp:
        try:
            package = pack(directory, Path(tmp), max_mib << 20)
        except PackagingError as exc:
            raise CliError(str(exc)) from exc
        uploaded = api.ensure_package(package.archive, package.sha256)
    what = "uploaded" if uploaded else "already stored"
    say(
        f"workdir {directory}: {package.files} files, {package.unpacked_bytes / (1 << 20):.1f} MiB "
        f"(package {package.sha256[:12]}, {package.size_bytes / (1 << 20):.1f} MiB, {what})"
    )
    return package.sha256
