"""Validates a run before it is stored, without importing user code in the server: its ``module`` and
``datamodule`` import, are LightningModule / LightningDataModule subclasses and take their arguments
(``module_args``, ``datamodule_args`` and the ``batch_size`` the agent adds), as the worker will build
them, with values that fit their annotations; its trainer callbacks and loggers import, take theirs and
can be built; its ``strategy_options`` are keywords of the strategy, with values it can run together.

:class:`ImportChecker` runs each check (``worker.agent.probe:check_in_child``, named by path) in the
server's fork server (:class:`~orchestrator.launchers.forkserver.ForkServer`, shared with the local
launcher), which has Lightning imported already and forks a child per check, so a check takes a
fraction of a second after the first (which waits for the fork server's own start-up, a few seconds).
A run with a code package (``workdir``) is checked against that package, with its requirements
installed, as a worker prepares them (:mod:`worker.runtime.env`), in the checker's own temporary cache;
a run without one against the server's interpreter and working directory (first on the fork server's
import path), which is what a local worker imports. Importing a module runs its code: the checks and
the installer get only the allow-listed environment of :mod:`orchestrator.launchers.childenv` (not the
admin token, the database URL or cloud keys) plus the run's own variables, and work in that temporary
directory, not the data dir. They still run as the server's user.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import InvalidRequest, Unavailable
from orchestrator.launchers.childenv import child_env
from orchestrator.launchers.forkserver import ForkServer, ForkServerError
from worker.protocol.redaction import redact
from worker.protocol.runs import RunSpec
from worker.runtime.env import InstallFailed, Runtime, find_installer, prepare_runtime
from worker.runtime.package import UnsafePackage

logger = logging.getLogger(__name__)

#: what the fork server runs for a check
CHECK_FUNCTION = "worker.agent.probe:check_in_child"
MISSING_MODULE_RE = re.compile(r"No module named '([^']+)'")


class ImportChecker:
    """Checks import paths in children of the fork server. Thread-safe; one check at a time.

    ``forkserver`` is the server's (shared with the local launcher); without one the checker starts
    its own, with the allow-listed environment (``pass_env`` added).
    """

    def __init__(
        self,
        timeout_s: float = 60.0,
        pass_env: Sequence[str] = (),
        runtime: RuntimeLimits | None = None,
        forkserver: ForkServer | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self._pass_env = tuple(pass_env)
        self._runtime = runtime or RuntimeLimits()
        self._forkserver = forkserver or ForkServer(child_env(os.environ, self._pass_env), Path.cwd())
        self._lock = threading.Lock()  # one check at a time
        self._temp_lock = threading.Lock()  # one temporary directory, made on first use
        self._workdir: str | None = None

    def warm_up(self) -> None:
        """Start the fork server in the background so the first check does not wait for its imports."""
        threading.Thread(
            target=self._forkserver.warm_up, args=(self.timeout_s,), name="forkserver-start", daemon=True
        ).start()

    def check_spec(self, spec: RunSpec, fetch_package: Callable[[Path], None] | None = None) -> None:
        """Raise :class:`InvalidRequest` naming the field that fails: the package (``fetch_package(dest)``
        writes it) or its requirements, a class that does not import or has the wrong base, arguments its
        constructor does not take, a strategy option the strategy does not take; :class:`Unavailable`
        when the probe itself cannot run."""
        runtime = self._prepare(spec, fetch_package)
        where = {
            "package_dir": str(runtime.package_dir) if runtime.package_dir else None,
            "site_dir": str(runtime.site_dir) if runtime.site_dir else None,
            "env": {**spec.env, **{k: v for k, v in spec.secret_env.items() if v is not None}},
        }
        failed = self.check(spec_checks(spec), where)
        if failed:
            field, error = failed
            hint = _import_hint(spec, error, runtime.package_dir) if "ModuleNotFoundError" in error else ""
            raise InvalidRequest(f"{field}: {error}{hint}" if field else f"{error}{hint}")

    def _prepare(self, spec: RunSpec, fetch_package: Callable[[Path], None] | None) -> Runtime:
        """The run's package and requirements in this checker's own cache (not the workers')."""
        if spec.workdir is None and not spec.requirements:
            return Runtime(None, None)
        if spec.workdir is not None and fetch_package is None:
            raise InvalidRequest("workdir: the package cannot be read")
        secrets = [v for v in spec.secret_env.values() if v]
        environ = {**self._probe_env(), **spec.env, **{k: v for k, v in spec.secret_env.items() if v}}
        try:
            return prepare_runtime(
                spec.workdir,
                spec.requirements,
                cache_dir=Path(self._temp_dir()) / "cache",
                fetch=fetch_package or _no_package,
                installer=find_installer(self._runtime.installer),
                environ=environ,
                timeout_s=self._runtime.install_timeout_s,
                max_unpacked_bytes=self._runtime.max_unpacked_bytes,
            )
        except UnsafePackage as exc:
            raise InvalidRequest(f"workdir: {exc}") from exc
        except InstallFailed as exc:
            raise InvalidRequest(f"requirements: {redact(str(exc), secrets)}") from exc
        except TimeoutError as exc:
            raise Unavailable(f"preparing the run's environment: {exc}") from exc

    def check(
        self, checks: list[dict[str, Any]], where: dict[str, Any] | None = None
    ) -> tuple[str, str] | None:
        """(field, reason) of the first of ``checks`` (see ``worker/agent/probe.py``) that fails,
        importing from ``where`` (the run's ``package_dir``, ``site_dir`` and ``env``) when given."""
        with self._lock:
            deadline = time.monotonic() + self.timeout_s
            request = {
                **(where or {}),
                "checks": checks,
                "timeout_s": max(1.0, deadline - time.monotonic() - 1),
                "cwd": self._temp_dir(),
            }
            try:
                reply = self._forkserver.call(CHECK_FUNCTION, request, deadline)
            except ForkServerError as exc:
                raise Unavailable(f"import check failed: {exc}") from exc
            if reply.get("ok"):
                return None
            return str(reply.get("field") or ""), str(reply.get("error") or "import check failed")

    def _temp_dir(self) -> str:
        """The probe's own directory: its working directory and the cache of runs' packages and
        requirements it checks (removed by :meth:`close`)."""
        with self._temp_lock:
            if self._workdir is None:
                self._workdir = tempfile.mkdtemp(prefix="spotswarm-import-probe-")
            return self._workdir

    def _probe_env(self) -> dict[str, str]:
        """The allow-listed environment, with the server's working directory first on the import path."""
        env = child_env(os.environ, self._pass_env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH")) if p)
        return env

    def close(self) -> None:
        """Stop the fork server and remove the temporary directory; does not wait for a check in
        progress (it holds the lock for up to ``timeout_s``), which fails once the fork server is gone.
        A server killed outright leaves no fork server either: it exits with its parent."""
        self._forkserver.close()
        with self._temp_lock:
            workdir, self._workdir = self._workdir, None
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


@dataclass(frozen=True)
class RuntimeLimits:
    """How the checker prepares a run's package and requirements (the server's settings)."""

    installer: str = "auto"
    install_timeout_s: float = 900.0
    max_unpacked_bytes: int = 1 << 30


def _no_package(dest: Path) -> None:  # noqa: ARG001 - the fetch callback's signature
    raise UnsafePackage("the run names no package")


def _import_hint(spec: RunSpec, error: str, package_dir: Path | None) -> str:
    """Where a module that was not found was looked for, and what to do: a dependency the package lacks
    needs a requirement; the run's own package not found is a matter of the workdir's layout."""
    if spec.workdir is not None:
        missing = MISSING_MODULE_RE.search(error)
        top = missing.group(1).split(".")[0] if missing else None
        if top is not None and top not in _own_packages(spec) and not _in_package(package_dir, top):
            return (
                f" ({top} is not in the run's package {spec.workdir[:12]}: if it is a dependency, install it "
                f"on the workers with --requirement {top} or --requirements-file requirements.txt)"
            )
        return (
            f" (imported from the run's package {spec.workdir[:12]}: is the module's top-level package at "
            "the top of the workdir, and not left out by .gitignore or .spotswarmignore?)"
        )
    return (
        f" (the orchestrator imports from its working directory {os.getcwd()} with {sys.executable}; "
        "ship your project with the run: spotswarm runs create --workdir DIR)"
    )


def _own_packages(spec: RunSpec) -> set[str]:
    """The top-level packages the spec's import paths name (``mypkg`` of ``mypkg.model:Net``)."""
    paths = [
        spec.module,
        spec.datamodule,
        *(p.path for p in (*spec.trainer.callbacks, *spec.trainer.loggers)),
    ]
    return {path.split(":")[0].split(".")[0] for path in paths}


def _in_package(package_dir: Path | None, top: str) -> bool:
    """Whether the extracted package holds the top-level module or package ``top``."""
    return package_dir is not None and ((package_dir / top).exists() or (package_dir / f"{top}.py").exists())


def spec_checks(spec: RunSpec) -> list[dict[str, Any]]:
    """What the probe checks of ``spec``: its classes by import path with their arguments, then its
    strategy options."""
    checks: list[dict[str, Any]] = [
        {"field": "module", "kind": "module", "path": spec.module, "args": spec.module_args},
        {
            "field": "datamodule",
            "kind": "datamodule",
            "path": spec.datamodule,
            "args": spec.datamodule_args,
            "batch_size": spec.batch_size,
        },
    ]
    for kind, plugins in (("callback", spec.trainer.callbacks), ("logger", spec.trainer.loggers)):
        for index, plugin in enumerate(plugins):
            field = f"trainer.{kind}s[{index}]"
            checks.append({"field": field, "kind": kind, "path": plugin.path, "args": plugin.args})
    options = dict(spec.strategy_options)
    checks.append({"field": "strategy_options", "kind": "strategy_options", "options": options})
    return checks
