"""The agent's start-up: register (or fall back to the cached registration), cache peers, make the run's
code ready (package, requirements, environment variables), build user objects.

Files kept in the worker directory:

- ``registration.json`` (mode 0600): the last registration reply, with the orchestrator URL and a hash of
  the join token it belongs to, so a restarted worker can train while the orchestrator is unreachable.
- ``peers.json``: the latest initial peers of the run (refreshed while training).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.agent.client import (
    ApiError,
    Conflict,
    NotFound,
    OrchestratorClient,
    Rejected,
    Unauthorized,
    Unreachable,
)
from worker.agent.config import AgentSettings
from worker.arguments import argument_type_problem
from worker.files import write_json
from worker.protocol.redaction import redact
from worker.protocol.runs import RunSpec
from worker.protocol.workers import WorkerRegister, WorkerRegistered
from worker.runtime import env as runtime_env
from worker.runtime.package import UnsafePackage

logger = logging.getLogger(__name__)

REGISTRATION_FILE = "registration.json"
PEERS_FILE = "peers.json"
# The orchestrator checked the package against its own limit at upload: this only bounds a worker's disk.
MAX_UNPACKED_BYTES = 64 << 30


class PermanentError(Exception):
    """A failure that another attempt with the same configuration would meet again (exit code 3)."""


class RunNotAccepting(PermanentError):
    """The run is stopping or finished (409): nothing to do, not an error of this worker (exit code 0)."""


class OrchestratorUnavailable(Exception):
    """The orchestrator stayed unreachable and nothing usable is cached (exit code 1)."""


class RunCodeUnavailable(Exception):
    """The run's package or requirements could not be made ready; another worker may succeed (exit 1)."""


@dataclass(frozen=True)
class Boot:
    """How the agent joined: the registration and whether it came from the cache (orchestrator down)."""

    registration: WorkerRegistered
    initial_peers: list[str]
    from_cache: bool


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def save_registration(worker_dir: Path, config: AgentSettings, registration: WorkerRegistered) -> None:
    """Remember the registration (it holds the worker token: owner-only file)."""
    payload = {
        "url": config.url,
        "join_token_sha256": _token_hash(config.join_token),
        "registration": registration.model_dump(mode="json"),
    }
    write_json(worker_dir / REGISTRATION_FILE, payload, private=True)


def load_registration(worker_dir: Path, config: AgentSettings) -> WorkerRegistered | None:
    """The cached registration for this orchestrator and join token, or None."""
    try:
        payload = json.loads((worker_dir / REGISTRATION_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None
    if payload.get("url") != config.url or payload.get("join_token_sha256") != _token_hash(config.join_token):
        return None
    return WorkerRegistered.model_validate(payload["registration"])


def save_peers(worker_dir: Path, run_name: str, peers: list[str]) -> None:
    """Remember the run's latest initial peers (ignored when empty: an old list beats none)."""
    if not peers:
        return
    write_json(worker_dir / PEERS_FILE, {"run": run_name, "initial_peers": peers, "saved_at": time.time()})


def load_peers(worker_dir: Path, run_name: str) -> list[str]:
    """The cached peers of ``run_name`` ([] if none)."""
    try:
        payload = json.loads((worker_dir / PEERS_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return []
    return list(payload.get("initial_peers", [])) if payload.get("run") == run_name else []


def register(
    client: OrchestratorClient,
    config: AgentSettings,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    stopping: Callable[[], bool] = lambda: False,
) -> Boot:
    """Register with the orchestrator, retrying for ``config.register_timeout_s`` while it is unreachable
    (and not ``stopping``: a worker told to leave before its first registration leaves at once).

    A launch token works until the worker has used the worker token its registration returned: a
    restarted agent whose launch token is refused registers again with the worker token it cached.
    Raises :class:`RunNotAccepting` when the run is stopping or finished, :class:`PermanentError` when
    the orchestrator refuses otherwise (bad join token), :class:`OrchestratorUnavailable` when it stays
    unreachable and no registration is cached.
    """
    body = WorkerRegister(
        request_id=config.request_id, hostname=socket.gethostname()[:255], launcher_handle=str(os.getpgrp())
    )
    deadline = clock() + config.register_timeout_s
    token = config.join_token
    while True:
        try:
            registration = client.register(token, body)
        except Unauthorized as exc:
            cached = load_registration(config.worker_dir, config) if token == config.join_token else None
            if cached is not None:
                logger.info("join token refused (%s); registering with the cached worker token", exc)
                token = cached.worker_token
                continue
            raise PermanentError(f"the orchestrator rejected the join token ({exc})") from exc
        except Conflict as exc:
            raise RunNotAccepting(f"the run takes no new workers ({exc})") from exc
        except (NotFound, Rejected) as exc:
            raise PermanentError(f"the orchestrator refused the registration ({exc})") from exc
        except Unreachable as exc:
            if stopping():
                raise OrchestratorUnavailable(
                    f"told to stop while the orchestrator at {config.url} was unreachable ({exc})"
                ) from exc
            if clock() >= deadline:
                return _boot_from_cache(config, exc)
            logger.warning("orchestrator unreachable, will retry registering: %s", exc)
            sleep(min(5.0, max(0.0, deadline - clock())))
            continue
        save_registration(config.worker_dir, config, registration)
        save_peers(config.worker_dir, registration.run.name, registration.initial_peers)
        return Boot(registration, registration.initial_peers, from_cache=False)


def _boot_from_cache(config: AgentSettings, error: Unreachable) -> Boot:
    cached = load_registration(config.worker_dir, config)
    if cached is None:
        raise OrchestratorUnavailable(
            f"the orchestrator at {config.url} stayed unreachable for {config.register_timeout_s:.0f} s "
            f"and no earlier registration is cached in {config.worker_dir} ({error})"
        )
    peers = load_peers(config.worker_dir, cached.run.name) or cached.initial_peers
    logger.warning(
        "orchestrator unreachable: rejoining run %s as worker %s with %d cached peer(s)",
        cached.run.name,
        cached.worker_id,
        len(peers),
    )
    return Boot(cached, peers, from_cache=True)


def prepare_run_code(config: AgentSettings, registration: WorkerRegistered) -> None:
    """Set the run's environment variables, make its package and requirements ready (cached per machine)
    and put them first on the import path, before any of the run's code is imported.

    Raises :class:`PermanentError` when the orchestrator refuses the package (none stored, not this
    run's), :class:`RunCodeUnavailable` for anything another attempt could get past (a download that
    failed, an installer error); messages never hold the run's secret values.
    """
    spec = registration.run
    os.environ.update(spec.env)
    os.environ.update(registration.secret_env)
    withheld = sorted(set(spec.secret_env) - set(registration.secret_env))
    if withheld:  # the run keeps its secrets from workers joined by hand (hand_joined_secrets: false)
        logger.warning("the run gives hand-joined workers no secret_env: %s not set", ", ".join(withheld))
    if spec.workdir is None and not spec.requirements:
        return
    started = time.monotonic()
    secrets = list(registration.secret_env.values())
    with OrchestratorClient(config.url, registration.worker_token, timeout_s=300.0) as client:
        try:
            runtime = runtime_env.prepare_runtime(
                spec.workdir,
                spec.requirements,
                cache_dir=config.cache_dir,
                fetch=lambda dest: client.download_package(spec.name, dest, spec.workdir or ""),
                installer=runtime_env.find_installer(config.installer),
                environ=dict(os.environ),
                timeout_s=config.install_timeout_s,
                max_unpacked_bytes=MAX_UNPACKED_BYTES,
            )
        except (NotFound, Rejected, Unauthorized) as exc:
            raise PermanentError(f"cannot get the run's package: {exc}") from exc
        except (ApiError, UnsafePackage, runtime_env.InstallFailed, TimeoutError, OSError) as exc:
            message = redact(f"{type(exc).__name__}: {exc}", secrets)
            raise RunCodeUnavailable(f"cannot prepare the run's code: {message}") from exc
    runtime_env.activate(runtime.package_dir, runtime.site_dir)
    logger.info(
        "run code ready in %.2f s: package %s, requirements %s",
        time.monotonic() - started,
        _what(spec.workdir[:12] if spec.workdir else None, runtime.package_cached, "downloaded"),
        _what(_lines(spec.requirements), runtime.env_cached, "installed"),
    )


def _lines(requirements: list[str]) -> str | None:
    return f"{len(requirements)} line(s)" if requirements else None


def _what(name: str | None, cached: bool, made: str) -> str:
    if name is None:
        return "none"
    return f"{name} ({'cached' if cached else made})"


def import_object(path: str) -> Any:
    """The object named by ``package.module:Name``; raises ImportError/AttributeError as Python does.

    The working directory is searched first, as with ``python -m``, also when the agent runs as the
    ``spotswarm-worker`` script (whose own directory would be first otherwise).
    """
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    module_name, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def build_user_objects(spec: RunSpec) -> tuple[Any, Any]:
    """Instantiate the run's LightningModule and DataModule with their arguments.

    The data module gets ``batch_size=spec.batch_size`` when it takes that argument and the spec does
    not set it (:func:`call_arguments`). An argument whose value does not fit the constructor's
    annotation is refused before the constructor runs (:mod:`worker.arguments`). Any failure (the
    user's code may raise anything) becomes a :class:`PermanentError` whose message names the import
    path and the exception in one line.
    """
    built = []
    for field, path, args, batch_size in (
        ("module_args", spec.module, spec.module_args, None),
        ("datamodule_args", spec.datamodule, spec.datamodule_args, spec.batch_size),
    ):
        try:
            factory = import_object(path)
            mistyped = argument_type_problem(factory, args)
            if mistyped:  # refused at create time: a spec stored before that check, or a hand-made one
                raise PermanentError(f"cannot build {path}: {field}.{mistyped[0]}: {mistyped[1]}")
            built.append(factory(**call_arguments(factory, args, batch_size)))
        except PermanentError:
            raise
        except Exception as exc:  # user code: any failure is reported, none is hidden
            first_line = (str(exc).strip().splitlines() or [""])[0]
            raise PermanentError(f"cannot build {path}: {type(exc).__name__}: {first_line}") from exc
    return built[0], built[1]


def call_arguments(factory: Any, args: dict[str, Any], batch_size: int | None) -> dict[str, Any]:
    """The keywords ``factory`` is built with: ``args``, plus ``batch_size`` (the spec's per-worker batch
    size, for the datamodule) when the factory takes that argument and ``args`` does not set it."""
    if batch_size is None or "batch_size" in args:
        return dict(args)
    try:
        takes = "batch_size" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        takes = False
    return {**args, "batch_size": batch_size} if takes else dict(args)
