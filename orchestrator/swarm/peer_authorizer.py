"""The authorizer of the orchestrator's own DHT peer: a router for every run, a store for none.

The orchestrator's peer is every worker's initial peer and reads each run's progress key, so it takes
part in every swarm with its own token (``*/orchestrator``, minted locally with the authority key;
workers accept it for DHT calls, never for averaging). Because one peer serves all runs, it is stricter
than a worker's :class:`~worker.admission.authorizer.SwarmAuthorizer`:

- it keeps no run data: store requests of any worker are emptied before hivemind handles them (the
  caller gets an empty, successful answer), and it neither caches what it reads nor caches it on others
  (``cache_locally=False, cache_nearest=0``). So a worker of run B cannot park a forged value for run
  A on the one peer that A's workers all ask;
- in answers to its own reads, it accepts values only for the progress key of the swarm named in the
  answering peer's token, so an admitted worker of run B cannot feed it run A's progress;
- peers without a token are served (routing only: ping and find, never a store) only while some active
  run has opted out of admission, and then their answers may only carry those runs' progress;
- in its answers to ``find``, it names only peers of the asking peer's own run (learnt from the tokens
  that signed their calls; for a peer without a token, only peers not known to hold one), so it never
  points a peer to another run's members, and never points admitted peers to intruders (who would
  otherwise receive their store requests, and so read their records).

Admitted workers check tokens themselves; this module only protects the orchestrator's peer.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

from hivemind.dht.routing import DHTID
from hivemind.p2p import PeerID
from hivemind.proto import dht_pb2
from hivemind.proto.auth_pb2 import AccessToken
from hivemind.utils.auth import AuthorizedRequestBase, AuthorizedResponseBase, TokenAuthorizerBase
from hivemind.utils.timed_storage import get_dht_time

from orchestrator.swarm.admission import SwarmAuthority
from orchestrator.swarm.dht import DHTPeer, progress_key
from worker.admission.access_tokens import from_access_token, is_valid_access_token, to_access_token
from worker.admission.authorizer import ensure_identity, load_identity
from worker.admission.tokens import ANY_SWARM, SwarmTokenError, TokenVerifier, peer_id_of

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=4096)
def _progress_key_id(swarm_id: str) -> bytes:
    return DHTID.generate(source=progress_key(swarm_id)).to_bytes()


def _empty_store(request: Any) -> None:
    """Turn a store request into one that stores nothing (hivemind then answers it normally)."""
    if isinstance(request, dht_pb2.StoreRequest) and request.keys:
        for field in (
            request.keys,
            request.subkeys,
            request.values,
            request.expiration_time,
            request.in_cache,
        ):
            del field[:]


def _values_only_for(request: Any, response: Any, swarms: frozenset[str] | None) -> bool:
    """Whether every value in a find answer belongs to the progress key of one of ``swarms`` (None: any)."""
    if swarms is None or not isinstance(response, dht_pb2.FindResponse):
        return True
    allowed = {_progress_key_id(swarm) for swarm in swarms}
    if len(request.keys) != len(response.results):
        return False
    for key, result in zip(request.keys, response.results, strict=True):
        if result.type != dht_pb2.NOT_FOUND and key not in allowed:
            return False
    return True


@functools.lru_cache(maxsize=4096)
def _holder(public_key: str) -> str:
    return peer_id_of(public_key)


class PeerRuns:
    """Which run each admitted peer belongs to, learnt from the tokens that signed its calls."""

    MAX_PEERS = 100_000

    def __init__(self) -> None:
        self._runs: dict[str, tuple[str, float]] = {}  # peer id (base58) -> (swarm id, token expiry)

    def note(self, token: AccessToken) -> None:
        fields = from_access_token(token)
        if len(self._runs) >= self.MAX_PEERS:
            now = get_dht_time()
            self._runs = {peer: item for peer, item in self._runs.items() if item[1] > now}
        self._runs[_holder(fields.public_key)] = (fields.swarm_id, fields.expires_at())

    def run_of(self, peer_id: str) -> str | None:
        item = self._runs.get(peer_id)
        return item[0] if item is not None and item[1] > get_dht_time() else None

    def keep_neighbours(self, response: Any, requester_swarm: str | None) -> None:
        """In a find answer, list only peers of the requester's run (for a peer without token: only
        peers not known to hold a token), so nobody learns where another run's peers are."""
        if not isinstance(response, dht_pb2.FindResponse):
            return
        for result in response.results:
            pairs = list(zip(result.nearest_node_ids, result.nearest_peer_ids, strict=False))
            kept = [(n, p) for n, p in pairs if self.run_of(PeerID(p).to_base58()) == requester_swarm]
            if len(kept) == len(pairs):
                continue
            del result.nearest_node_ids[:]
            del result.nearest_peer_ids[:]
            result.nearest_node_ids.extend(n for n, _ in kept)
            result.nearest_peer_ids.extend(p for _, p in kept)


class OrchestratorPeerAuthorizer(TokenAuthorizerBase):
    """hivemind authorizer of the orchestrator's DHT peer (see the module docstring for the rules).

    ``identity_path`` is the peer's libp2p identity file (created here if missing), so that the
    token's key is the peer's own. ``open_swarms`` (the opted-out runs whose token-less peers it serves)
    is replaced through :func:`set_open_swarms`.
    """

    def __init__(
        self, authority: SwarmAuthority, identity_path: Path, open_swarms: frozenset[str] = frozenset()
    ) -> None:
        ensure_identity(identity_path)
        key, self.peer_id = load_identity(identity_path)
        super().__init__(local_private_key=key)
        self._authority = authority
        self._verifier = TokenVerifier(authority.public_key, None, clock=get_dht_time)
        self.open_swarms = frozenset(open_swarms)
        self.peer_runs = PeerRuns()

    async def get_token(self) -> AccessToken:
        public_key = self.local_public_key.to_bytes().decode()
        return to_access_token(self._authority.orchestrator_token(public_key, get_dht_time()))

    def is_token_valid(self, access_token: AccessToken) -> bool:
        return is_valid_access_token(self._verifier, access_token)

    def does_token_need_refreshing(self, access_token: AccessToken) -> bool:
        try:
            remaining_s = from_access_token(access_token).expires_at() - get_dht_time()
        except SwarmTokenError:
            return True
        return remaining_s < self._authority.ttl_s / 2

    async def validate_request(self, request: AuthorizedRequestBase) -> bool:
        token = request.auth.client_access_token
        if not token.signature:
            if not self.open_swarms:
                return False
            _empty_store(request)
            return True
        if not await super().validate_request(request):
            return False
        self.peer_runs.note(token)
        if from_access_token(token).swarm_id != ANY_SWARM:
            _empty_store(request)
        return True

    async def sign_response(self, response: AuthorizedResponseBase, request: AuthorizedRequestBase) -> None:
        token = request.auth.client_access_token
        requester_swarm = from_access_token(token).swarm_id if token.signature else None
        self.peer_runs.keep_neighbours(response, requester_swarm)
        await super().sign_response(response, request)

    async def validate_response(
        self, response: AuthorizedResponseBase, request: AuthorizedRequestBase
    ) -> bool:
        token = response.auth.service_access_token
        if not token.signature:
            allowed: frozenset[str] | None = self.open_swarms
            if not allowed:
                return False
        else:
            if not await super().validate_response(response, request):
                return False
            self.peer_runs.note(token)
            swarm_id = from_access_token(token).swarm_id
            allowed = None if swarm_id == ANY_SWARM else frozenset({swarm_id})
        if _values_only_for(request, response, allowed):
            return True
        logger.warning(
            "dropped a DHT answer of %r carrying values of another run", token.username or "a peer"
        )
        return False


async def set_open_swarms(swarms: frozenset[str], _dht: Any, node: Any) -> None:
    """Runs in the DHT process (``dht.run_coroutine(partial(set_open_swarms, swarms))``)."""
    authorizer = node.protocol.authorizer
    if isinstance(authorizer, OrchestratorPeerAuthorizer):
        authorizer.open_swarms = frozenset(swarms)


def push_open_swarms(dht: DHTPeer, swarms: frozenset[str], timeout_s: float | None = None) -> None:
    """Hand the set of opted-out swarms to the authorizer in the DHT's process (raises
    ``DHTUnavailable`` when the peer is down or does not answer within ``timeout_s``)."""
    dht.run_coroutine(functools.partial(set_open_swarms, frozenset(swarms)), timeout_s)


def peer_dht_options(
    authority: SwarmAuthority, identity_path: Path, open_swarms: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Extra ``hivemind.DHT`` keywords of the orchestrator's peer under admission."""
    return {
        "authorizer": OrchestratorPeerAuthorizer(authority, identity_path, open_swarms),
        "cache_locally": False,
        "cache_nearest": 0,
    }
