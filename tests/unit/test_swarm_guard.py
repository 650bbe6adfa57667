"""The averaging guard's memory (worker/admission/guard.py): what it remembers of callers is dropped once
it has expired, so a stream of new peer identities cannot grow it without bound.

The guard asks each new caller for its token through hivemind's P2P; here a small stand-in for that P2P
answers with real tokens signed by a real authority key (or with no token), and the guard's clock is the
test's.
"""

from __future__ import annotations

import asyncio
import contextlib

from cryptography.hazmat.primitives.asymmetric import rsa
from hivemind.p2p import P2PHandlerError, PeerID
from hivemind.proto.auth_pb2 import AccessToken

from worker.admission.access_tokens import to_access_token
from worker.admission.guard import AdmissionGuard, PeerNotAdmitted
from worker.admission.tokens import TokenVerifier, openssh_public_key, peer_id_of, sign_token

NOW = 1_800_000_000.0
TOKEN_TTL_S = 60.0
REFUSAL_TTL_S = 5.0


class TokenServingPeers:
    """Stands in for hivemind's P2P: each known peer serves its token, any other caller serves none."""

    def __init__(self) -> None:
        self.tokens: dict[PeerID, AccessToken] = {}

    async def call_protobuf_handler(self, peer: PeerID, *_: object) -> AccessToken:
        if peer not in self.tokens:
            raise P2PHandlerError("no such handler")
        return self.tokens[peer]


def new_peer() -> tuple[PeerID, str]:
    public = openssh_public_key(rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key())
    return PeerID.from_base58(peer_id_of(public)), public


def test_expired_admissions_and_refusals_are_forgotten() -> None:
    authority = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    clock = [NOW]
    verifier = TokenVerifier(openssh_public_key(authority.public_key()), "run-a", clock=lambda: clock[0])
    guard = AdmissionGuard(verifier, refusal_ttl_s=REFUSAL_TTL_S, clock=lambda: clock[0])
    p2p = TokenServingPeers()
    member, public = new_peer()
    token = sign_token(authority, "run-a", "worker-1", public, NOW + TOKEN_TTL_S)
    p2p.tokens[member] = to_access_token(token)
    strangers = [PeerID(bytes([0x12, 0x20]) + i.to_bytes(32, "big")) for i in range(50)]

    async def scenario() -> None:
        await guard.require(p2p, member)  # type: ignore[arg-type]
        for stranger in strangers:
            try:
                await guard.require(p2p, stranger)  # type: ignore[arg-type]
            except PeerNotAdmitted:
                pass
            else:
                raise AssertionError("a peer without a token was admitted")
        assert guard.remembered_peers() == 1 + len(strangers)

        clock[0] += REFUSAL_TTL_S + 1  # every refusal has expired; the member's token has not
        late, _ = new_peer()
        with contextlib.suppress(PeerNotAdmitted):
            await guard.require(p2p, late)  # type: ignore[arg-type]
        assert guard.remembered_peers() == 2  # the member and the newest refusal

        clock[0] = NOW + TOKEN_TTL_S + REFUSAL_TTL_S + 1  # the member's token has expired too
        with contextlib.suppress(PeerNotAdmitted):
            await guard.require(p2p, strangers[0])  # type: ignore[arg-type]
        assert guard.remembered_peers() == 1  # only that caller's fresh refusal

    asyncio.run(scenario())
