"""A monitoring DHT peer of a run with swarm admission, as an operator runs one beside the orchestrator.

Whoever operates the orchestrator can read its data dir, and with it the swarm authority's signing key
(``<data dir>/swarm_authority.pem``): the key the orchestrator signs its own DHT peer's token with. A
monitoring peer on that host signs itself a token of the run's swarm (subject ``monitor``) with that key
and renews it the same way, so it needs neither a worker row (a registered worker would count among the
run's workers and be retired as a surplus) nor the orchestrator's API, and keeps reading while the
orchestrator is down. It runs in client mode: it reads, no peer routes through it or stores on it.
Holding the key, it could admit anyone to any run; that key never leaves the orchestrator's host.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from hivemind.dht.crypto import RSASignatureValidator

from orchestrator.swarm.admission import SwarmAuthority
from worker.admission.authorizer import AdmissionDHT, SwarmAuthorizer
from worker.protocol.swarm_tokens import SwarmToken

TOKEN_TTL_S = 600.0
SUBJECT = "monitor"


class SelfSignedTokens:
    """A token ``fetch`` for :class:`SwarmAuthorizer` that signs locally with the authority key."""

    def __init__(self, authority_key_path: Path, swarm_id: str) -> None:
        key = serialization.load_pem_private_key(authority_key_path.read_bytes(), password=None)
        assert isinstance(key, rsa.RSAPrivateKey), f"{authority_key_path} holds no RSA key"
        self._authority = SwarmAuthority(key, TOKEN_TTL_S)
        self._swarm_id = swarm_id

    def __call__(self, public_key: str) -> SwarmToken:
        return self._authority.grant(self._swarm_id, SUBJECT, public_key, time.time())


def monitor_dht(authority_key_path: Path, swarm_id: str, initial_peers: Sequence[str]) -> AdmissionDHT:
    """A started client-mode DHT peer of ``swarm_id`` holding a self-signed token; reads progress records."""
    fetch = SelfSignedTokens(authority_key_path, swarm_id)
    authorizer = SwarmAuthorizer.create(swarm_id, fetch)  # a new identity, deleted once the daemon read it
    return AdmissionDHT(
        list(initial_peers),
        authorizer=authorizer,
        client_mode=True,
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        record_validators=[RSASignatureValidator()],
    )
