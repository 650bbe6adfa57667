"""Swarm admission, peer side: hold a token from the orchestrator, check everyone else's.

:class:`SwarmAuthorizer` is a hivemind ``TokenAuthorizerBase``: given to ``hivemind.DHT(authorizer=...)``
it signs every DHT request and response of this peer with its token and refuses requests and responses
whose token is missing, not signed by the orchestrator, for another run or expired (see
:mod:`worker.admission.tokens`). Its key *is* the peer's libp2p identity key, so the token also names the
peer id; :mod:`worker.admission.guard` relies on that to guard averaging, which hivemind does not authorize.
:class:`AdmissionDHT` is the DHT peer that uses both (:meth:`SwarmAuthorizer.start_dht` starts one).

Tokens come from an injected callable ``fetch(public_key) -> SwarmToken`` (the agent passes
:class:`worker.agent.token_cache.ClientTokenSource`, which calls ``POST /workers/{id}/swarm-token``).
hivemind calls it from the DHT's own (forked) process whenever the token has less than half its lifetime
left. If the orchestrator cannot be reached, the peer keeps its token until it expires, asking again
every ``retry_interval_s``.

Nothing here imports the orchestrator.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hivemind
from hivemind.p2p import P2P, P2PContext, PeerID
from hivemind.proto import crypto_pb2
from hivemind.proto.auth_pb2 import AccessToken
from hivemind.utils.auth import TokenAuthorizerBase
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.timed_storage import get_dht_time

from worker.admission.access_tokens import from_access_token, is_valid_access_token, to_access_token
from worker.admission.guard import ADMISSION_HANDLER, AdmissionGuard, GuardedP2P
from worker.admission.tokens import SwarmTokenError, TokenFields, TokenVerifier
from worker.protocol.swarm_tokens import SwarmToken
from worker.strategy.dht import LifelineDHT

logger = logging.getLogger(__name__)

TokenFetcher = Callable[[str], SwarmToken]
MIN_RENEW_BEFORE_S = 5.0


class SwarmTokenUnavailable(RuntimeError):
    """No valid token could be obtained (orchestrator unreachable, worker no longer admitted...)."""


def ensure_identity(path: Path) -> None:
    """Create a libp2p RSA identity file at ``path`` (mode 0400) unless one exists."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        P2P.generate_identity(str(path))


def load_identity(path: Path) -> tuple[RSAPrivateKey, str]:
    """The identity file's key as a hivemind ``RSAPrivateKey``, and its peer id (base58).

    Raises :class:`SwarmTokenError` when the file does not hold an RSA libp2p key.
    """
    data = path.read_bytes()
    message = crypto_pb2.PrivateKey.FromString(data)
    if message.key_type != crypto_pb2.KeyType.RSA:
        raise SwarmTokenError(f"{path}: swarm admission needs an RSA identity (key type {message.key_type})")
    key = RSAPrivateKey.__new__(RSAPrivateKey)
    key.__setstate__({"_private_key": message.data})  # hivemind's own way to rebuild a key from DER
    return key, PeerID.from_identity(data).to_base58()


class SwarmAuthorizer(TokenAuthorizerBase):
    """A hivemind authorizer holding this peer's swarm token and checking other peers' tokens.

    Build it with :meth:`create`, which also fetches the first token (so a refusal shows at once, not
    as a DHT that cannot reach anyone). ``identity_path`` is this peer's libp2p identity file; a new
    one is made in a private temporary directory when it is None. Pass the same file to the DHT
    (:class:`AdmissionDHT` does; :meth:`start_dht` starts one).
    """

    def __init__(
        self,
        swarm_id: str,
        fetch: TokenFetcher,
        first_token: SwarmToken,
        identity_path: Path,
        *,
        clock: Callable[[], float] = get_dht_time,
        retry_interval_s: float = 5.0,
    ) -> None:
        key, peer_id = load_identity(identity_path)
        super().__init__(local_private_key=key)
        self.swarm_id = swarm_id
        self.peer_id = peer_id
        self.identity_path = identity_path
        self.verifier = TokenVerifier(first_token.authority_public_key, swarm_id, clock=clock)
        self._fetch_token = fetch
        self._renewal: asyncio.Task[None] | None = None
        self._clock = clock
        self._retry_interval_s = retry_interval_s
        self._next_fetch_at = 0.0
        self._renew_before_s = MIN_RENEW_BEFORE_S
        self._local_access_token = self._accept(first_token)
        self.temporary_identity = False  # True: identity_path is a file of ours in a private temp dir

    @classmethod
    def create(
        cls,
        swarm_id: str,
        fetch: TokenFetcher,
        identity_path: Path | None = None,
        *,
        clock: Callable[[], float] = get_dht_time,
        retry_interval_s: float = 5.0,
    ) -> SwarmAuthorizer:
        """Make (or read) the identity, fetch the first token, build the authorizer.

        Raises :class:`SwarmTokenUnavailable` when the orchestrator refuses or cannot be reached and
        :class:`SwarmTokenError` when its answer is unusable.
        """
        temporary = identity_path is None
        if identity_path is None:
            identity_path = Path(tempfile.mkdtemp(prefix="spotswarm-peer-")) / "identity.key"
        ensure_identity(identity_path)
        key, _ = load_identity(identity_path)
        first = fetch(key.get_public_key().to_bytes().decode())
        authorizer = cls(
            swarm_id, fetch, first, identity_path, clock=clock, retry_interval_s=retry_interval_s
        )
        authorizer.temporary_identity = temporary
        return authorizer

    def discard_temporary_identity(self) -> None:
        """Delete an identity file made by :meth:`create` once the peer's daemon has read it."""
        if self.temporary_identity:
            self.identity_path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self.identity_path.parent.rmdir()
            self.temporary_identity = False

    def start_dht(self, initial_peers: list[str], **dht_kwargs: Any) -> hivemind.DHT:
        """This peer's DHT in the swarm: an :class:`AdmissionDHT` with this authorizer, started. What
        ``HivemindStrategy(authorizer=...)`` calls (``worker.strategy.dht.start_dht``)."""
        return AdmissionDHT(initial_peers, authorizer=self, **dht_kwargs)

    @property
    def public_key_text(self) -> str:
        return self.local_public_key.to_bytes().decode()

    def current_token(self) -> AccessToken:
        """The token this peer presents now (possibly expired if renewals failed)."""
        token = self._local_access_token
        assert token is not None, "set in __init__"
        return token

    def _accept(self, grant: SwarmToken) -> AccessToken:
        """Check a token the orchestrator handed us: ours, for our swarm, signed by the known authority."""
        if grant.authority_public_key.strip() != self.verifier.authority_public_key:
            raise SwarmTokenError("the orchestrator's signing key changed; restart the worker to trust it")
        fields = TokenFields(grant.username, grant.public_key, grant.expiration_time, grant.signature)
        if fields.public_key.strip() != self.public_key_text.strip():
            raise SwarmTokenError("the orchestrator issued a token for another key")
        reason = self.verifier.problem(fields, accept_orchestrator=False)
        if reason is not None:
            raise SwarmTokenError(f"the orchestrator issued an unusable token: {reason}")
        lifetime_s = fields.expires_at() - self._clock()
        self._renew_before_s = max(MIN_RENEW_BEFORE_S, lifetime_s / 2)
        logger.info("swarm token for %s valid until %s", fields.username, fields.expiration_time)
        return to_access_token(fields)

    # -- TokenAuthorizerBase -------------------------------------------------------------------------

    async def get_token(self) -> AccessToken:
        """The token to use now. While the current one is valid, it is returned at once and a renewal
        runs in the background (so a slow or absent orchestrator never stalls DHT traffic); without a
        valid token, one fetch is awaited (at most one per ``retry_interval_s``)."""
        current = self._local_access_token
        if current is not None and self.is_token_valid(current):
            self._renew_in_background()
            return current
        token = await self._fetch()
        if token is None:
            raise SwarmTokenUnavailable("no valid swarm token: this peer cannot talk to the swarm for now")
        return token

    def _renew_in_background(self) -> None:
        if self._renewal is not None and not self._renewal.done():
            return
        if self._clock() < self._next_fetch_at:
            return
        self._renewal = asyncio.get_running_loop().create_task(self._renew())

    async def _renew(self) -> None:
        token = await self._fetch()
        if token is not None:
            self._local_access_token = token

    async def _fetch(self) -> AccessToken | None:
        """Ask the orchestrator once (unless asked less than ``retry_interval_s`` ago); None on failure."""
        now = self._clock()
        if now < self._next_fetch_at:
            return None
        self._next_fetch_at = now + self._retry_interval_s
        try:
            loop = asyncio.get_running_loop()
            grant = await loop.run_in_executor(None, self._fetch_token, self.public_key_text)
            return self._accept(grant)
        except (SwarmTokenUnavailable, SwarmTokenError) as exc:
            logger.warning("could not renew the swarm token: %s", exc)
            return None

    async def wait_for_renewal(self) -> None:
        """Wait until a background renewal (if one runs) has finished."""
        if self._renewal is not None:
            await asyncio.shield(self._renewal)

    def is_token_valid(self, access_token: AccessToken) -> bool:
        return is_valid_access_token(self.verifier, access_token)

    def does_token_need_refreshing(self, access_token: AccessToken) -> bool:
        try:
            remaining_s = from_access_token(access_token).expires_at() - self._clock()
        except SwarmTokenError:
            return True
        return remaining_s < self._renew_before_s


class AdmissionDHT(LifelineDHT):
    """A ``hivemind.DHT`` that takes part in a swarm with admission.

    Its DHT calls are signed and checked by ``authorizer``; it uses the authorizer's identity (so its
    peer id is the one named in the token); it serves the token on :data:`ADMISSION_HANDLER`; and the
    P2P it hands to averagers (``replicate_p2p``) guards every averaging handler. Always started; its
    process ends with the one that created it (:class:`worker.strategy.dht.LifelineDHT`).
    """

    def __init__(
        self, initial_peers: list[str] | None = None, *, authorizer: SwarmAuthorizer, **kwargs: Any
    ) -> None:
        given = kwargs.pop("identity_path", None)
        if given is not None and os.path.abspath(given) != os.path.abspath(authorizer.identity_path):
            raise ValueError(
                f"identity_path {given!r} differs from the swarm authorizer's identity "
                f"{str(authorizer.identity_path)!r}; create the authorizer with that identity instead"
            )
        kwargs.pop("start", None)
        self._admission_verifier = authorizer.verifier
        super().__init__(
            initial_peers,
            start=True,
            authorizer=authorizer,
            identity_path=str(authorizer.identity_path),
            check_if_identity_free=False,
            **kwargs,
        )
        self.run_coroutine(serve_token)
        authorizer.discard_temporary_identity()  # the daemon has read it

    async def replicate_p2p(self) -> P2P:
        """Like hivemind's, but the replica guards every handler registered on it (averagers')."""
        # the same caching as hivemind.DHT.replicate_p2p: one replica per process
        replica: P2P | None = getattr(self, "_p2p_replica", None)
        if replica is None or getattr(self, "_origin_pid", None) != os.getpid():
            self._origin_pid = os.getpid()
            daemon_listen_maddr = self.run_coroutine(hivemind.DHT._get_p2p_daemon_listen_maddr)
            guarded = await GuardedP2P.replicate(daemon_listen_maddr)
            guarded.admission_guard = AdmissionGuard(self._admission_verifier)
            self._p2p_replica = replica = guarded
        return replica


async def serve_token(_dht: hivemind.DHT, node: Any) -> None:
    """``dht.run_coroutine(serve_token)``: in the DHT process, answer :data:`ADMISSION_HANDLER` with the
    current token of the DHT's authorizer (one with ``refresh_token_if_needed`` and ``current_token``)."""
    authorizer: SwarmAuthorizer = node.protocol.authorizer

    async def own_token(_request: AccessToken, _context: P2PContext) -> AccessToken:
        await authorizer.refresh_token_if_needed()
        return authorizer.current_token()

    await node.p2p.add_protobuf_handler(ADMISSION_HANDLER, own_token, AccessToken)
