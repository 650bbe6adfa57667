"""The worker's last swarm token and its identity key, kept in the worker directory.

A swarm token is bound to the peer's identity key (its peer id), so both are kept, per worker id (two
workers may share a directory): ``swarm/<worker id>/identity.key`` (the libp2p identity, owner-read-only)
and ``swarm/<worker id>/token.json`` (the last token the orchestrator granted, owner-only). A worker that
restarts while the orchestrator is down boots from its cached registration and peers
(:mod:`worker.agent.boot`) and, with this, still presents a token the swarm accepts until the token
expires (``swarm_token_ttl_s`` on the orchestrator, 10 minutes by default); it renews as soon as the
orchestrator answers again.

Nothing here imports hivemind at import time.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from worker.admission.tokens import SwarmTokenError, parse_expiration
from worker.agent.client import ApiError, OrchestratorClient
from worker.files import write_json
from worker.protocol.swarm_tokens import SwarmToken

logger = logging.getLogger(__name__)

IDENTITY_FILE = "identity.key"
TOKEN_FILE = "token.json"


def swarm_dir(worker_dir: Path, worker_id: str) -> Path:
    """The directory (made owner-only) holding worker ``worker_id``'s identity and token."""
    path = _swarm_path(worker_dir, worker_id)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def _swarm_path(worker_dir: Path, worker_id: str) -> Path:
    return worker_dir / "swarm" / worker_id


def identity_path(worker_dir: Path, worker_id: str) -> Path:
    """Where worker ``worker_id`` keeps its libp2p identity (made on first use by the swarm authorizer)."""
    return swarm_dir(worker_dir, worker_id) / IDENTITY_FILE


def save_token(worker_dir: Path, worker_id: str, grant: SwarmToken) -> None:
    """Remember ``grant`` for ``worker_id`` (atomically, readable by the owner only)."""
    payload = {"worker_id": worker_id, "token": grant.model_dump(mode="json")}
    write_json(swarm_dir(worker_dir, worker_id) / TOKEN_FILE, payload, private=True)


def load_token(
    worker_dir: Path, worker_id: str, swarm_id: str, clock: Callable[[], float] = time.time
) -> SwarmToken | None:
    """The cached token of ``worker_id`` for ``swarm_id`` if it has not expired, else None."""
    try:
        payload = json.loads((_swarm_path(worker_dir, worker_id) / TOKEN_FILE).read_text())
        grant = SwarmToken.model_validate(payload["token"])
        expires_at = parse_expiration(grant.expiration_time)
    except (FileNotFoundError, ValueError, KeyError, TypeError, ValidationError, SwarmTokenError) as exc:
        if not isinstance(exc, FileNotFoundError):
            logger.warning("ignoring unreadable cached swarm token: %s", exc)
        return None
    if payload.get("worker_id") != worker_id or grant.swarm_id != swarm_id:
        return None
    if expires_at <= clock():
        logger.info("the cached swarm token expired at %s", grant.expiration_time)
        return None
    return grant


class CachingTokenSource:
    """A token ``fetch`` that saves every token it obtains to the worker directory."""

    def __init__(self, fetch: Callable[[str], SwarmToken], worker_dir: Path, worker_id: str) -> None:
        self._fetch = fetch
        self._worker_dir = worker_dir
        self._worker_id = worker_id

    def __call__(self, public_key: str) -> SwarmToken:
        grant = self._fetch(public_key)
        try:
            save_token(self._worker_dir, self._worker_id, grant)
        except OSError as exc:  # a full or read-only disk costs the cache, not the token
            logger.warning("could not cache the swarm token: %s", exc)
        return grant


class ClientTokenSource:
    """``fetch`` for :class:`~worker.admission.authorizer.SwarmAuthorizer` over the worker's HTTP client,
    safe to call after a fork.

    hivemind calls ``fetch`` from the DHT's forked process; an HTTP client (and its pooled sockets)
    must not be shared across processes, so each process makes its own with ``make_client()``.
    Failures of the client (:class:`~worker.agent.client.ApiError`) become ``SwarmTokenUnavailable``.
    """

    def __init__(self, make_client: Callable[[], OrchestratorClient], worker_id: str) -> None:
        self._make_client = make_client
        self._worker_id = worker_id
        self._client: OrchestratorClient | None = None
        self._pid = -1

    def __call__(self, public_key: str) -> SwarmToken:
        from worker.admission.authorizer import SwarmTokenUnavailable  # hivemind: loaded by the caller

        if self._client is None or self._pid != os.getpid():
            self._client, self._pid = self._make_client(), os.getpid()
        try:
            return self._client.swarm_token(self._worker_id, public_key)
        except ApiError as exc:
            raise SwarmTokenUnavailable(f"the orchestrator gave no swarm token: {exc}") from exc
