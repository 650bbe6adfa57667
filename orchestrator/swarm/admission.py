"""Swarm admission, orchestrator side: the signing key, tokens for registered workers, opted-out runs.

The orchestrator is the authority of every run's swarm: it signs short-lived tokens (see
:mod:`worker.admission.tokens`) binding a worker's peer key to its run, and only for workers it registered
and that have not ended. The key lives in ``<data dir>/swarm_authority.pem`` (mode 0600; setting
``swarm_authority_key_file``) and is made on first start; whoever holds it can admit anyone to any run,
so guard it like the admin token. Orchestrators sharing a database share it
(:mod:`orchestrator.domain.deployment_facts`).

Runs are admitted by default; a run spec with ``strategy_options: {"swarm_admission": false}`` opts out
(its peers use no tokens). :class:`SwarmAdmission` keeps the set of active opted-out runs and pushes it
to the orchestrator's DHT peer, which then lets token-less peers use it for routing (see
:mod:`orchestrator.swarm.peer_authorizer`; ``create_app`` wires the two together). The peer must know a
run opted out *before* the run's first peers knock: it refuses token-less peers it does not know to serve,
and a peer refused at its first contact cannot join the swarm through it. So the set is read before the DHT
peer starts, and pushed again before a worker of an opted-out run is told where the peer is (its
registration), not only every ``dht_refresh_interval_s``. The design and threat model:
``docs/concepts/swarm-admission.md``.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator import files
from orchestrator.db.models import Run, Worker
from orchestrator.db.session import Database
from orchestrator.domain.states import ACTIVE_RUN_STATES, TOKEN_WORKER_STATES
from orchestrator.errors import Conflict, InvalidRequest, NotFound, RunNotAcceptingWorkers
from orchestrator.swarm.dht import DHTUnavailable
from worker.admission.tokens import (
    ANY_SWARM,
    ORCHESTRATOR_SUBJECT,
    SwarmTokenError,
    TokenFields,
    openssh_public_key,
    peer_id_of,
    sign_token,
)
from worker.protocol.runs import swarm_admission_requested
from worker.protocol.swarm_tokens import SwarmAuthInfo, SwarmToken, SwarmTokenRequest

logger = logging.getLogger(__name__)


def load_or_create_key(path: Path) -> rsa.RSAPrivateKey:
    """The RSA key in ``path`` (PEM, PKCS#8), or a new 2048-bit one written there with mode 0600.

    Raises ``OSError`` when the file cannot be read or written and ``ValueError`` when it is no RSA key.
    """
    if path.exists():
        key = _parsed_private_key(path.read_bytes())
        if not isinstance(key, rsa.RSAPrivateKey):
            raise ValueError(f"{path} does not hold an RSA private key")
        return key
    path.parent.mkdir(parents=True, exist_ok=True)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    if not files.create_atomic(path, pem, private=True):  # another orchestrator on this data dir won
        return load_or_create_key(path)
    logger.info("swarm admission: new signing key in %s", path)
    return key


@functools.lru_cache(maxsize=4)
def _parsed_private_key(pem: bytes) -> Any:
    """The key in ``pem``, parsed once per process for the same bytes: parsing checks the RSA key (about
    50 ms of CPU), which an app built again in one process (a reload, the in-process API tests) would
    otherwise pay at each start for the same file. Keys are immutable objects, safe to share."""
    return serialization.load_pem_private_key(pem, password=None)


class SwarmAuthority:
    """Signs swarm tokens with the orchestrator's key; each lives ``ttl_s`` seconds."""

    def __init__(self, key: rsa.RSAPrivateKey, ttl_s: float) -> None:
        self._key = key
        self.ttl_s = ttl_s
        self.public_key = openssh_public_key(key.public_key())

    def sign(self, swarm_id: str, subject: str, public_key: str, now: float) -> TokenFields:
        """A token for ``public_key`` in ``swarm_id``; raises ``SwarmTokenError`` for an unusable key."""
        return sign_token(self._key, swarm_id, subject, public_key, now + self.ttl_s)

    def orchestrator_token(self, public_key: str, now: float) -> TokenFields:
        """The token of the orchestrator's own DHT peer: valid in every run's swarm."""
        return self.sign(ANY_SWARM, ORCHESTRATOR_SUBJECT, public_key, now)

    def grant(self, swarm_id: str, subject: str, public_key: str, now: float) -> SwarmToken:
        """A token with what a worker needs to use and check it (its peer id, the authority's key)."""
        fields = self.sign(swarm_id, subject, public_key, now)
        return SwarmToken(
            username=fields.username,
            public_key=fields.public_key,
            expiration_time=fields.expiration_time,
            signature=fields.signature,
            swarm_id=swarm_id,
            peer_id=peer_id_of(fields.public_key),
            authority_public_key=self.public_key,
        )


class SwarmAdmission:
    """The orchestrator's admission state: its authority and the active runs that opted out."""

    def __init__(self, authority: SwarmAuthority) -> None:
        self.authority = authority
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()  # one read-and-push at a time: a stale set never wins
        self._open_swarms: frozenset[str] | None = None  # None: not read yet
        self._push: Callable[[frozenset[str]], Any] | None = None

    @classmethod
    def from_key_file(cls, path: Path, ttl_s: float) -> SwarmAdmission:
        return cls(SwarmAuthority(load_or_create_key(path), ttl_s))

    @property
    def open_swarms(self) -> frozenset[str]:
        with self._lock:
            return self._open_swarms or frozenset()

    def info(self) -> SwarmAuthInfo:
        return SwarmAuthInfo(
            enabled=True,
            authority_public_key=self.authority.public_key,
            token_ttl_s=self.authority.ttl_s,
            open_swarms=sorted(self.open_swarms),
        )

    def grant_for_worker(
        self, session: Session, worker_id: int, body: SwarmTokenRequest, now: float
    ) -> SwarmToken:
        """A token for a registered, not ended worker of an active run that uses admission; the token's
        peer id is recorded as the worker's (its heartbeats may announce addresses of that peer only).

        Raises :class:`NotFound`, :class:`Conflict` (run opted out, worker not registered or ended),
        :class:`RunNotAcceptingWorkers` (run finished) or :class:`InvalidRequest` (unusable key).
        The caller has checked the worker token.
        """
        worker = session.get(Worker, worker_id)
        if worker is None:
            raise NotFound(f"worker {worker_id} not found")
        run = worker.run
        if not swarm_admission_requested(run.strategy_options):
            raise Conflict(f"run {run.name!r} admits any peer (swarm_admission is false): no token needed")
        if run.state not in ACTIVE_RUN_STATES:
            raise RunNotAcceptingWorkers(f"run {run.name!r} is {run.state}")
        if worker.state not in TOKEN_WORKER_STATES:
            raise Conflict(f"worker {worker_id} is {worker.state}; only registered, live workers get tokens")
        try:
            token = self.authority.grant(run.swarm_id, f"worker-{worker.id}", body.public_key, now)
        except SwarmTokenError as exc:
            raise InvalidRequest(f"unusable public key: {exc}") from exc
        worker.peer_id = token.peer_id
        logger.debug("swarm token for worker %d (peer %s) of run %s", worker.id, token.peer_id, run.name)
        return token

    def serve_from_start(self, db: Database) -> frozenset[str]:
        """The active opted-out runs, read from ``db`` for the DHT peer to start with (so a restarted peer
        refuses none of their peers), and remembered as what the peer holds."""
        open_swarms = read_open_swarms(db)
        with self._lock:
            self._open_swarms = open_swarms
        return open_swarms

    def bind_peer(self, push: Callable[[frozenset[str]], Any]) -> None:
        """How to hand the set to the running DHT peer (raises ``DHTUnavailable`` when it is down)."""
        self._push = push

    def serve_opted_out(self, db: Database, swarm_id: str) -> None:
        """Make sure the DHT peer serves the token-less peers of ``swarm_id`` (an opted-out run) before
        one of them is told where the peer is: pushes the set now unless the peer has it already.

        A DHT peer that is down is logged, not raised: the worker could not join through it anyway,
        and the periodic sync pushes the set once it is back.
        """
        with self._lock:
            if self._open_swarms is not None and swarm_id in self._open_swarms:
                return
        try:
            self.sync_open_swarms(db)
        except DHTUnavailable as exc:
            logger.warning("swarm admission: the DHT peer did not learn that %s opted out: %s", swarm_id, exc)

    def sync_open_swarms(self, db: Database) -> None:
        """Read which active runs opted out; hand the set to the DHT peer when it changed."""
        push = self._push
        if push is None:
            raise RuntimeError("SwarmAdmission.bind_peer was not called")
        with self._sync_lock:
            now_open = read_open_swarms(db)
            with self._lock:
                if now_open == self._open_swarms:
                    return
            push(now_open)
            with self._lock:
                self._open_swarms = now_open
        logger.info("swarm admission: %d active run(s) without tokens", len(now_open))


def read_open_swarms(db: Database) -> frozenset[str]:
    """The swarm ids of the active runs that opted out of admission."""
    with db.read() as session:
        query = select(Run.swarm_id, Run.strategy_options).where(Run.state.in_(ACTIVE_RUN_STATES))
        rows = session.execute(query)
        return frozenset(sid for sid, options in rows if not swarm_admission_requested(options or {}))
