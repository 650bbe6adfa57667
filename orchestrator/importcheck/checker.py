"""Validates a run before it is stored, without importing user code in the server: its ``module`` and
``datamodule`` import, are LightningModule / LightningDataModule subclasses and take their arguments
(``module_args``, ``datamodule_args`` and the ``batch_size`` the agent adds), as the worker will build
them; its trainer callbacks and loggers import and take theirs; its ``strategy_options`` are keywords
of the strategy.

:class:`ImportChecker` keeps one probe process (``orchestrator.importcheck.probe``) that has Lightning
imported already and forks a child per check, so a check takes a fraction of a second after the first
(which waits for the probe's own start-up, a few seconds). A run with a code package (``workdir``) is
checked against that package, with its requirements installed, as a worker prepares them
(:mod:`worker.runtime.env`), in the checker's own temporary cache; a run without one against the
server's interpreter and working directory (first on the probe's ``PYTHONPATH``), which is what a local
worker imports. Importing a module runs its code: the probe and the installer get only the allow-listed
environment of :mod:`orchestrator.launchers.childenv` (not the admin token, the database URL or cloud keys)
plus the run's own variables, and work in that temporary directory, not the data dir. They still run as the
server's user.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from orchestrator.errors import InvalidRequest, Unavailable
from orchestrator.launchers.childenv import child_env
from worker.runtime.env import InstallFailed, Runtime, find_installer, prepare_runtime, redact
from worker.runtime.package import UnsafePackage
from worker.wire import RunSpec

logger = logging.getLogger(__name__)

PROBE_EXIT_WAIT_S = 3.0  # a probe told to stop has this long before it is killed


class ImportChecker:
    """Checks import paths in an isolated probe process. Thread-safe; one check at a time."""

    def __init__(
        self,
        timeout_s: float = 60.0,
        pass_env: Sequence[str] = (),
        runtime: RuntimeLimits | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self._pass_env = tuple(pass_env)
        self._runtime = runtime or RuntimeLimits()
        self._lock = threading.Lock()  # one check (or the warm-up) at a time
        self._spawn_lock = threading.Lock()  # guards _proc, _workdir, _closed: no probe after close()
        self._temp_lock = threading.Lock()  # one temporary directory, made on first use
        self._proc: subprocess.Popen[bytes] | None = None
        self._workdir: str | None = None
        self._closed = False

    def warm_up(self) -> None:
        """Start the probe in the background so the first check does not wait for Lightning's import."""
        threading.Thread(target=self._warm, name="import-probe-start", daemon=True).start()

    def _warm(self) -> None:
        try:
            with self._lock:
                self._ensure_probe(time.monotonic() + self.timeout_s)
        except Unavailable as exc:
            if not self._closed:  # closing the checker during its warm-up ends the warm-up too
                logger.warning("import probe did not start: %s", exc)

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
            hint = _import_hint(spec) if "ModuleNotFoundError" in error else ""
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
        """(field, reason) of the first of ``checks`` (see ``orchestrator/importcheck/probe.py``) that fails,
        importing from ``where`` (the run's ``package_dir``, ``site_dir`` and ``env``) when given."""
        with self._lock:
            deadline = time.monotonic() + self.timeout_s
            proc = self._ensure_probe(deadline)
            assert proc.stdin is not None and proc.stdout is not None
            request = {
                **(where or {}),
                "checks": checks,
                "timeout_s": max(1.0, deadline - time.monotonic() - 1),
            }
            try:
                proc.stdin.write((json.dumps(request) + "\n").encode())
                proc.stdin.flush()
                reply = _read_line(proc.stdout, deadline)
            except (OSError, ValueError, TimeoutError) as exc:  # ValueError: closed by close()
                self._kill()
                raise Unavailable(f"import check failed: {exc}") from exc
            if reply.get("ok"):
                return None
            return str(reply.get("field") or ""), str(reply.get("error") or "import check failed")

    def _ensure_probe(self, deadline: float) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        with self._spawn_lock:
            if self._closed:
                raise Unavailable("the import checker is closed (the server is stopping)")
            proc = subprocess.Popen(
                [sys.executable, "-m", "orchestrator.importcheck.probe", str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=self._probe_env(),
                cwd=self._temp_dir(),
                start_new_session=True,  # a Ctrl-C in the server's terminal is for the server, not the probe
            )
            self._proc = proc
        assert proc.stdout is not None
        try:
            hello = _read_line(proc.stdout, deadline)
        except (OSError, TimeoutError) as exc:
            self._kill()
            raise Unavailable(f"the import probe did not start: {exc}") from exc
        if not hello.get("ready"):
            self._kill()
            raise Unavailable(f"the import probe said {hello!r}")
        logger.info("import probe ready (pid %d)", proc.pid)
        return proc

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

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(timeout=10)
            self._proc = None

    def close(self) -> None:
        """Stop the probe within seconds (closing its stdin ends it; killed if it lingers).

        Does not wait for a check or the warm-up in progress (they hold the lock for up to
        ``timeout_s``): their reads fail once the probe is gone. A server killed outright leaves no
        probe either: it exits with its parent.
        """
        with self._spawn_lock:
            self._closed = True
            proc, workdir = self._proc, self._workdir
        if proc is not None:
            _stop(proc)
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


def _import_hint(spec: RunSpec) -> str:
    """Where a module that was not found was looked for, and what to do."""
    if spec.workdir is not None:
        return (
            f" (imported from the run's package {spec.workdir[:12]}: is the module's top-level package at "
            "the top of the workdir, and not left out by .gitignore or .spotswarmignore?)"
        )
    return (
        f" (the orchestrator imports from its working directory {os.getcwd()} with {sys.executable}; "
        "ship your project with the run: spotswarm runs create --workdir DIR)"
    )


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
    keys = list(spec.strategy_options)
    checks.append({"field": "strategy_options", "kind": "strategy_options", "keys": keys})
    return checks


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End the probe: closing its stdin ends its loop; killed if it lingers."""
    if proc.stdin is not None:
        # OSError: a check is writing to it right now; the kill below ends both
        with contextlib.suppress(OSError):
            proc.stdin.close()
    try:
        proc.wait(timeout=PROBE_EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=PROBE_EXIT_WAIT_S)


def _read_line(stream: IO[bytes], deadline: float) -> dict[str, Any]:
    """One JSON line from the probe before ``deadline`` (monotonic); raises TimeoutError or OSError."""
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
            raise TimeoutError("no answer from the import probe in time")
    line = stream.readline()
    if not line:
        raise OSError("the import probe exited")
    return dict(json.loads(line))
