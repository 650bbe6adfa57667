"""The run's code and environment in ``spotswarm runs create``: ``--workdir`` (packed and uploaded once),
``--requirement``/``--requirements-file`` (else the workdir's own ``requirements.txt``), ``--env`` and
``--secret-env``; and ``--dry-run``, which lists what would be packed and creates nothing.

The spec's fields are checked here, with the same model the orchestrator parses, before anything is packed
or uploaded: a spec the server would refuse for a missing name or module costs no upload. Files that look
like secrets are left out (:mod:`orchestrator.cli.packaging`) and named, and every create says what it
packed.

``workdir`` in a spec file is a directory (relative to the file) or, as ``runs show --json`` prints it, the
SHA-256 of a package the orchestrator has. Secret values never come back from the API: a spec read back
names its secrets with null values, and ``--secret-env NAME`` (the value from your environment) or
``--secret-env NAME=VALUE`` gives them again.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import click
from pydantic import ValidationError

from orchestrator.cli.client import ApiClient, CliError
from orchestrator.cli.output import echo_json, fmt_bytes
from orchestrator.cli.packaging import Package, PackagingError, pack
from worker.protocol.errors import validation_errors
from worker.protocol.runs import RunSpec

F = TypeVar("F", bound=Callable[..., Any])
DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")
USAGE = 2
DEFAULT_REQUIREMENTS = "requirements.txt"
TOP_LEVEL_SHOWN = 8
#: stands in for the package's digest while the spec is checked before packing
PLACEHOLDER_DIGEST = "0" * 64


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
    click.option(
        "--requirements-txt/--no-requirements-txt",
        default=True,
        show_default=True,
        help="Without --requirement or --requirements-file: install the workdir's top-level "
        "requirements.txt, if it has one.",
    ),
    click.option(
        "--include-secrets",
        is_flag=True,
        help="Pack what is left out by default: orchestrator data dirs and files that look like keys, "
        "tokens or credentials (*.pem, *.key, *token*, .env, id_rsa*, ...).",
    ),
    click.option(
        "--dry-run",
        is_flag=True,
        help="Check the spec and list every file --workdir would pack, then exit: nothing is uploaded or "
        "created.",
    ),
    click.option("--env", multiple=True, metavar="NAME=VALUE", help="Environment variable of the run."),
    click.option(
        "--secret-env",
        multiple=True,
        metavar="NAME[=VALUE]",
        help="Secret environment variable (never shown again): NAME takes the value from your environment.",
    ),
]


@contextlib.contextmanager
def code_of_run(
    spec: dict[str, Any], flags: dict[str, Any], spec_dir: Path, say: Callable[[str], None]
) -> Iterator[Package | None]:
    """Fill ``spec``'s ``requirements``, ``env`` and ``secret_env`` from the flags (which win over the spec
    file), check its fields, then pack the workdir directory, if any, into a temporary directory that
    lives as long as the context (yielded: None without one). Raises :class:`CliError`."""
    workdir_dir = _workdir_dir(spec, flags, spec_dir)
    if flags.get("requirement"):
        spec["requirements"] = [*(spec.get("requirements") or []), *flags["requirement"]]
    if flags.get("requirements_file"):
        spec["requirements"] = [*(spec.get("requirements") or []), _requirements_line(flags, workdir_dir)]
    if flags.get("env"):
        spec["env"] = {**(spec.get("env") or {}), **_env_pairs(flags["env"])}
    if flags.get("secret_env"):
        spec["secret_env"] = {**(spec.get("secret_env") or {}), **_secret_pairs(flags["secret_env"])}
    if workdir_dir is None:  # nothing to pack: the server checks the spec (a 422 naming the field)
        yield None
        return
    check_fields(spec)
    with tempfile.TemporaryDirectory(prefix="spotswarm-package-") as tmp:
        try:
            package = pack(
                workdir_dir, Path(tmp), (flags.get("workdir_max_mib") or 100) << 20, flags["include_secrets"]
            )
        except PackagingError as exc:
            raise CliError(str(exc)) from exc
        _default_requirements(spec, flags, package, say)
        yield package


def check_fields(spec: dict[str, Any]) -> None:
    """Raise :class:`CliError` with the orchestrator's words (``missing fields: name, module``) when the
    spec's fields are not a run spec, before its workdir is packed or uploaded."""
    try:
        RunSpec.model_validate({**spec, "workdir": PLACEHOLDER_DIGEST})
    except ValidationError as exc:
        errors = validation_errors([dict(error) for error in exc.errors()])
        raise CliError(f"spec: {errors} (nothing was packed or uploaded)") from exc


def _default_requirements(
    spec: dict[str, Any], flags: dict[str, Any], package: Package, say: Callable[[str], None]
) -> None:
    """The workdir's top-level requirements.txt as the run's requirements, when none are given."""
    if spec.get("requirements") or not flags.get("requirements_txt", True):
        return
    if any(entry.name == DEFAULT_REQUIREMENTS for entry in package.entries):
        spec["requirements"] = [f"-r {DEFAULT_REQUIREMENTS}"]
        say(
            f"requirements: the workdir's {DEFAULT_REQUIREMENTS}, installed on every worker "
            "(--no-requirements-txt leaves it out)"
        )


def upload_code(api: ApiClient, package: Package, directory: str, say: Callable[[str], None]) -> str:
    """Upload ``package`` unless the orchestrator has it, say what it holds, and return its SHA-256."""
    uploaded = api.ensure_package(package.archive, package.sha256)
    what = "uploaded" if uploaded else "already stored"
    stored = f"package {package.sha256[:12]}, {fmt_bytes(package.size_bytes)}, {what}"
    say(f"{_summary(package, directory)} ({stored})")
    _say_left_out(package, say)
    return package.sha256


def show_dry_run(
    package: Package | None, directory: str, spec: dict[str, Any], say: Callable[[str], None], as_json: bool
) -> None:
    """Every file ``package`` holds, with its size, and what was left out (with ``as_json``: those and
    the spec, as JSON on stdout); nothing is sent."""
    if as_json:
        files = (
            [{"name": e.name, "size_bytes": e.size, "link": e.link} for e in package.entries]
            if package
            else []
        )
        left_out = (
            [{"name": item.name, "reason": item.reason} for item in package.left_out] if package else []
        )
        shown = {**spec, "secret_env": dict.fromkeys(spec["secret_env"])} if spec.get("secret_env") else spec
        echo_json({"dry_run": True, "spec": shown, "files": files, "left_out": left_out})
        return
    if package is not None:
        say(_summary(package, directory))
        for entry in package.entries:
            target = f" -> {entry.link}" if entry.link is not None else ""
            say(f"  {entry.name}{target}  {fmt_bytes(entry.size)}")
        _say_left_out(package, say)
    say("dry run: the spec is valid; nothing was uploaded or created")


def _summary(package: Package, directory: str) -> str:
    """``workdir DIR: N files, SIZE: mypkg/ (3 files), requirements.txt``: the top-level entries."""
    counts: dict[str, int] = {}
    for entry in package.entries:
        top, sep, _ = entry.name.partition("/")
        counts[top + sep] = counts.get(top + sep, 0) + 1
    shown = [
        f"{top} ({n} file{'s' if n > 1 else ''})" if top.endswith("/") else top for top, n in counts.items()
    ]
    if len(shown) > TOP_LEVEL_SHOWN:
        shown = [*shown[:TOP_LEVEL_SHOWN], f"... {len(shown) - TOP_LEVEL_SHOWN} more"]
    listing = f": {', '.join(shown)}" if shown else ""
    return f"workdir {directory}: {package.files} files, {fmt_bytes(package.unpacked_bytes)}{listing}"


def _say_left_out(package: Package, say: Callable[[str], None]) -> None:
    if package.left_out:
        reasons = "; ".join(f"{item.name}: {item.reason}" for item in package.left_out)
        say(f"left out {len(package.left_out)} (--include-secrets packs them): {reasons}")


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
