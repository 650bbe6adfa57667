"""The agent's start-up: register (or fall back to the cached registration), cache peers, build user objects.

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

from worker.agent_config import AgentConfig
from worker.client import Conflict, NotFound, OrchestratorClient, Rejected, Unauthorized, Unreachable
from worker.files import write_json
from worker.wire import RunSpec, WorkerRegister, WorkerRegistered

logger = logging.getLogger(__name__)

REGISTRATION_FILE = "registration.json"
PEERS_FILE = "peers.json"


class PermanentError(Exception):
    """A failure that another attempt with the same configuration would meet again (exit code 3)."""


class RunNotAccepting(PermanentError):
    """The run is stopping or finished (409): nothing to do, not an error of this worker (exit code 0)."""


class OrchestratorUnavailable(Exception):
    """The orchestrator stayed unreachable and nothing usable is cached (exit code 1)."""


@dataclass(frozen=True)
class Boot:
    """How the agent joined: the registration and whether it came from the cache (orchestrator down)."""

    registration: WorkerRegistered
    initial_peers: list[str]
    from_cache: bool


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def save_registration(worker_dir: Path, config: AgentConfig, registration: WorkerRegistered) -> None:
    """Remember the registration (it holds the worker token: owner-only file)."""
    payload = {
        "url": config.url,
        "join_token_sha256": _token_hash(config.join_token),
        "registration": registration.model_dump(mode="json"),
    }
    write_json(worker_dir / REGISTRATION_FILE, payload, private=True)


def load_registration(worker_dir: Path, config: AgentConfig) -> WorkerRegistered | None:
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
    config: AgentConfig,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Boot:
    """Register with the orchestrator, retrying for ``config.register_timeout_s`` while it is unreachable.

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
            if clock() >= deadline:
                return _boot_from_cache(config, exc)
            logger.warning("orchestrator unreachable, will retry registering: %s", exc)
            sleep(min(5.0, max(0.0, deadline - clock())))
            continue
        save_registration(config.worker_dir, config, registration)
        save_peers(config.worker_dir, registration.run.name, registration.initial_peers)
        return Boot(registration, registration.initial_peers, from_cache=False)


def _boot_from_cache(config: AgentConfig, error: Unreachable) -> Boot:
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
    not set it. Any failure (the user's code may raise anything) becomes a :class:`PermanentError`
    whose message names the import path and the exception in one line.
    """
    datamodule_args = dict(spec.datamodule_args)
    built = []
    for path, args in ((spec.module, spec.module_args), (spec.datamodule, datamodule_args)):
        try:
            factory = import_object(path)
            if path == spec.datamodule and "batch_size" not in args and _takes_batch_size(factory):
                args = {**args, "batch_size": spec.batch_size}
            built.append(factory(**args))
        except Exception as exc:  # noqa: BLE001 - user code: any failure is reported, none is hidden
            first_line = (str(exc).strip().splitlines() or [""])[0]
            raise PermanentError(f"cannot build {path}: {type(exc).__name__}: {first_line}") from exc
    return built[0], built[1]


def _takes_batch_size(factory: Any) -> bool:
    try:
        return "batch_size" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
