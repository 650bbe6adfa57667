"""A run's requirements, installed into an environment layered on the worker's own interpreter.

The environment is a virtualenv of the worker's Python under ``<cache_dir>/envs/<key>/`` that sees the
worker's own packages and installs only what the run adds, so torch, Lightning and hivemind are never
downloaded again:

- a ``.pth`` file in its site-packages puts the worker's site-packages after its own (pip, run with the
  environment's interpreter, sees every package the worker has);
- a copy of each worker distribution's metadata (``*.dist-info`` without the files, whose ``RECORD``
  names only the copy) tells installers that read site-packages directly, like uv, the same; an upgrade
  removes the copy, never the worker's files;
- a constraints file pins torch, lightning and hivemind to the worker's versions, so a requirement that
  wants others fails to resolve instead of shadowing them.

The key is a hash of the requirement lines, the worker's interpreter and its installed distributions, and
the package digest when a line can refer to the package's files (``-r requirements.txt``, a local path, an
option). The agent then puts the package directory and the environment's site-packages first on
``sys.path`` (:func:`activate`) in its own process: user code runs with the agent's interpreter.
uv installs when it is there (much faster: see bench/runtime_env.py), else pip.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import shlex
import shutil
import site
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from worker.files import locked
from worker.runtime.package import ensure_package

logger = logging.getLogger(__name__)

ENVS_DIR = "envs"
PINNED_DISTRIBUTIONS = ("torch", "lightning", "hivemind")
STUB_FILES = ("METADATA", "WHEEL", "INSTALLER", "entry_points.txt", "top_level.txt", "direct_url.json")
BASE_PTH = "_spotswarm_base.pth"
OUTPUT_TAIL_LINES = 12
INSTALLERS = ("auto", "uv", "pip")
# A plain PEP 508 requirement (name, extras, version, markers; no URL): its meaning does not depend on
# the package's files.
_PLAIN_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,\s-]*\])?\s*([<>=!~;(].*)?$")


class InstallFailed(RuntimeError):
    """Installing a run's requirements failed; the message ends with the installer's last lines."""


@dataclass(frozen=True)
class Installer:
    """``uv pip`` or pip: the command that installs into the environment of ``python``."""

    name: str
    executable: str

    def install_command(self, python: Path, requirements: Sequence[str], constraints: Path) -> list[str]:
        """The command line; the requirement lines become arguments (see :func:`install_arguments`)."""
        args = [*install_arguments(requirements), "-c", str(constraints)]
        if self.name == "uv":
            return [self.executable, "pip", "install", "--python", str(python), *args]
        quiet = ["--disable-pip-version-check", "--no-input"]
        return [str(python), "-m", "pip", "install", *quiet, *args]


def install_arguments(requirements: Sequence[str]) -> list[str]:
    """Requirements-file lines as installer arguments: an option line (``-r file``, ``--find-links dir``)
    is split like a shell would, a requirement (``x>=1; python_version>'3.8'``) stays one argument,
    comments go. Given on the command line, relative paths are the working directory's (the package's)
    for pip and uv alike; in a file, uv would take them relative to that file."""
    args: list[str] = []
    for line in requirements:
        text = re.sub(r"(^|\s)#.*$", "", line).strip()
        if text.startswith("-"):
            args.extend(shlex.split(text))
        elif text:
            args.append(text)
    return args


def find_installer(choice: str = "auto") -> Installer:
    """uv when ``choice`` is ``auto`` or ``uv`` and uv is installed, else pip; raises InstallFailed when
    the chosen one is missing."""
    if choice not in INSTALLERS:
        raise InstallFailed(f"unknown installer {choice!r}; use one of {', '.join(INSTALLERS)}")
    if choice in ("auto", "uv"):
        uv = _uv_executable()
        if uv is not None:
            return Installer("uv", uv)
        if choice == "uv":
            raise InstallFailed("the installer 'uv' is not installed (pip install uv)")
    if importlib.util.find_spec("pip") is None:
        raise InstallFailed("neither uv nor pip is installed for this interpreter")
    return Installer("pip", sys.executable)


def _uv_executable() -> str | None:
    try:
        import uv  # the PyPI wheel ships the binary and says where it is

        return str(uv.find_uv_bin())
    except (ImportError, FileNotFoundError):
        return shutil.which("uv")


def base_site_dirs() -> list[Path]:
    """The site-packages directories of the worker's own environment."""
    paths = sysconfig.get_paths()
    dirs = dict.fromkeys(Path(paths[key]) for key in ("purelib", "platlib"))
    return [d for d in dirs if d.is_dir()]


def _refers_to_package(line: str) -> bool:
    return not _PLAIN_REQUIREMENT.match(line.strip()) or "@" in line


def requirements_key(requirements: Sequence[str], package_digest: str | None) -> str:
    """The cache key of the environment for ``requirements`` on this interpreter."""
    refers = package_digest is not None and any(_refers_to_package(line) for line in requirements)
    installed = sorted(p.name for d in base_site_dirs() for p in d.glob("*.dist-info"))
    material = {
        "requirements": list(requirements),
        "package": package_digest if refers else None,
        "python": sys.version,
        "executable": os.path.realpath(sys.executable),
        "installed": hashlib.sha256("\n".join(installed).encode()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:32]


def ensure_requirements_env(
    cache_dir: Path,
    requirements: Sequence[str],
    *,
    package_dir: Path | None,
    package_digest: str | None,
    installer: Installer,
    environ: Mapping[str, str],
    timeout_s: float,
) -> tuple[Path, bool]:
    """The site-packages directory holding ``requirements`` and whether it was cached already.

    The installer runs in ``package_dir`` (relative paths in the lines are the package's) with
    ``environ``. Raises :class:`InstallFailed` (nothing is kept) or TimeoutError (another process held
    the environment longer than ``timeout_s``).
    """
    key = requirements_key(requirements, package_digest)
    root = cache_dir / ENVS_DIR
    env_dir, ready = root / key, root / f"{key}.ready"
    site_dir = env_dir / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    with locked(root / f"{key}.lock", timeout_s):
        if ready.exists():
            return site_dir, True
        shutil.rmtree(env_dir, ignore_errors=True)
        try:
            _create_layered_env(env_dir, site_dir)
            _install(env_dir, requirements, package_dir, installer, environ, timeout_s)
        except BaseException:
            shutil.rmtree(env_dir, ignore_errors=True)
            raise
        ready.touch()
    return site_dir, False


def _create_layered_env(env_dir: Path, site_dir: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(env_dir)], capture_output=True, text=True
    )
    if done.returncode != 0 or not site_dir.is_dir():
        raise InstallFailed(f"cannot create an environment in {env_dir}: {done.stderr.strip()[-500:]}")
    base = base_site_dirs()
    (site_dir / BASE_PTH).write_text("".join(f"{d}\n" for d in base))
    for directory in base:
        for dist_info in directory.glob("*.dist-info"):
            _copy_metadata(dist_info, site_dir / dist_info.name)


def _copy_metadata(source: Path, dest: Path) -> None:
    """The metadata of an installed distribution without its files; its RECORD lists only the copy."""
    dest.mkdir(exist_ok=True)
    copied = []
    for name in STUB_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, dest / name)
            copied.append(name)
    record = "".join(f"{dest.name}/{name},,\n" for name in [*copied, "RECORD"])
    (dest / "RECORD").write_text(record)


def _pins() -> list[str]:
    pins = []
    for name in PINNED_DISTRIBUTIONS:
        try:
            pins.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return pins


def _install(
    env_dir: Path,
    requirements: Sequence[str],
    package_dir: Path | None,
    installer: Installer,
    environ: Mapping[str, str],
    timeout_s: float,
) -> None:
    constraints = env_dir / "spotswarm-constraints.txt"
    constraints.write_text("".join(f"{pin}\n" for pin in _pins()))
    command = installer.install_command(env_dir / "bin" / "python", requirements, constraints)
    log_path = env_dir / "install.log"
    env = {k: v for k, v in environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    try:
        with log_path.open("w") as log:
            done = subprocess.run(
                command,
                cwd=str(package_dir or env_dir),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
            )
    except subprocess.TimeoutExpired as exc:
        raise InstallFailed(f"{installer.name} took longer than {timeout_s:.0f} s") from exc
    if done.returncode != 0:
        tail = _installer_words(log_path.read_text(errors="replace"), env_dir)[-OUTPUT_TAIL_LINES:]
        raise InstallFailed(f"{installer.name} install failed (exit {done.returncode}): " + " | ".join(tail))


def _installer_words(output: str, env_dir: Path) -> list[str]:
    """The installer's lines without where the environment is (uv's ``Using Python ... environment at:
    PATH``, the path elsewhere): a local path says nothing to whoever reads the error, often on another
    machine, and took half of the server's error for a ``runs create``."""
    lines = [line for line in output.strip().splitlines() if " environment at: " not in line]
    return [line.replace(str(env_dir), "the run's environment") for line in lines]


def activate(package_dir: Path | None, site_dir: Path | None) -> None:
    """Put ``package_dir`` and then ``site_dir`` first on ``sys.path`` (``.pth`` files of the environment
    are processed) and make ``package_dir`` the working directory, as a user's own ``python`` in the
    project would."""
    if site_dir is not None:
        before = list(sys.path)
        site.addsitedir(str(site_dir))
        sys.path[:] = [p for p in sys.path if p not in before] + before
    if package_dir is not None:
        sys.path.insert(0, str(package_dir))
        os.chdir(package_dir)
    importlib.invalidate_caches()


@dataclass(frozen=True)
class Runtime:
    """Where a run's code and requirements are on this machine, and whether each was cached."""

    package_dir: Path | None
    site_dir: Path | None
    package_cached: bool = False
    env_cached: bool = False


def prepare_runtime(
    workdir: str | None,
    requirements: Sequence[str],
    *,
    cache_dir: Path,
    fetch: Callable[[Path], object],
    installer: Installer,
    environ: Mapping[str, str],
    timeout_s: float,
    max_unpacked_bytes: int,
) -> Runtime:
    """The run's package (``fetch(dest)`` downloads it when it is not cached) and requirements
    environment, each made once per machine. Raises UnsafePackage, InstallFailed or TimeoutError."""
    package_dir, package_cached = None, False
    if workdir is not None:
        package_dir, package_cached = ensure_package(cache_dir, workdir, fetch, max_unpacked_bytes, timeout_s)
    site_dir, env_cached = None, False
    if requirements:
        site_dir, env_cached = ensure_requirements_env(
            cache_dir,
            requirements,
            package_dir=package_dir,
            package_digest=workdir,
            installer=installer,
            environ=environ,
            timeout_s=timeout_s,
        )
    return Runtime(package_dir, site_dir, package_cached, env_cached)
