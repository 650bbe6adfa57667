"""Swarm tokens: what the orchestrator signs and what peers accept (worker/admission/tokens.py), the worker's
authorizer (renewal, fallback while the orchestrator is away) and the orchestrator peer's policy."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from orchestrator.swarm.admission import SwarmAuthority, load_or_create_key
from worker.admission.tokens import (
    SwarmTokenError,
    TokenFields,
    TokenVerifier,
    load_rsa_public_key,
    openssh_public_key,
    peer_id_of,
    sign_token,
)
from worker.protocol.runs import swarm_admission_requested
from worker.protocol.swarm_tokens import SwarmToken

NOW = 1_800_000_000.0


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def authority_key() -> rsa.RSAPrivateKey:
    return rsa_key()


@pytest.fixture(scope="module")
def peer_public() -> str:
    return openssh_public_key(rsa_key().public_key())


def verifier(authority: rsa.RSAPrivateKey, swarm_id: str | None = "run-a", now: float = NOW) -> TokenVerifier:
    return TokenVerifier(openssh_public_key(authority.public_key()), swarm_id, clock=lambda: now)


def test_a_token_signed_for_the_run_is_valid_until_it_expires(authority_key, peer_public) -> None:
    token = sign_token(authority_key, "run-a", "worker-1", peer_public, NOW + 60)
    assert token.swarm_id == "run-a" and token.subject == "worker-1"
    assert verifier(authority_key).problem(token) is None
    assert "expired" in (verifier(authority_key, now=NOW + 60).problem(token) or "")


def test_tokens_of_another_run_another_signer_or_tampered_are_refused(authority_key, peer_public) -> None:
    token = sign_token(authority_key, "run-b", "worker-1", peer_public, NOW + 60)
    assert "not 'run-a'" in (verifier(authority_key).problem(token) or "")
    forged = sign_token(rsa_key(), "run-a", "worker-1", peer_public, NOW + 60)
    assert verifier(authority_key).problem(forged) == "not signed by this orchestrator"
    good = sign_token(authority_key, "run-a", "worker-1", peer_public, NOW + 60)
    other_key = openssh_public_key(rsa_key().public_key())
    for tampered in (
        TokenFields("run-a/worker-2", good.public_key, good.expiration_time, good.signature),
        TokenFields(good.username, good.public_key, "2099-01-01T00:00:00+00:00", good.signature),
        TokenFields(good.username, other_key, good.expiration_time, good.signature),
    ):
        assert verifier(authority_key).problem(tampered) == "not signed by this orchestrator"
    assert "malformed" in (verifier(authority_key).problem(TokenFields("", "", "", "")) or "")


def test_the_orchestrator_token_opens_every_runs_dht_but_not_averaging(authority_key, peer_public) -> None:
    token = sign_token(authority_key, "*", "orchestrator", peer_public, NOW + 60)
    assert verifier(authority_key, "run-a").problem(token) is None
    assert verifier(authority_key, "run-z").problem(token) is None
    assert "averaging" in (verifier(authority_key).problem(token, accept_orchestrator=False) or "")
    wildcard_worker = sign_token(authority_key, "*", "worker-1", peer_public, NOW + 60)
    assert "every swarm" in (verifier(authority_key, None).problem(wildcard_worker) or "")


def test_a_token_admits_only_the_peer_whose_key_it_names(authority_key, peer_public) -> None:
    token = sign_token(authority_key, "run-a", "worker-1", peer_public, NOW + 60)
    assert verifier(authority_key).problem_for_peer(token, peer_id_of(peer_public)) is None
    other = peer_id_of(openssh_public_key(rsa_key().public_key()))
    assert "belongs to peer" in (verifier(authority_key).problem_for_peer(token, other) or "")


def test_only_rsa_keys_of_2048_bits_or_more_get_tokens(authority_key) -> None:
    small = openssh_public_key(rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key())
    with pytest.raises(SwarmTokenError, match="1024 bits"):
        sign_token(authority_key, "run-a", "worker-1", small, NOW + 60)
    ec_key = ec.generate_private_key(ec.SECP256R1()).public_key()
    from cryptography.hazmat.primitives import serialization

    ec_text = ec_key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    with pytest.raises(SwarmTokenError, match="RSA"):
        load_rsa_public_key(ec_text)
    with pytest.raises(SwarmTokenError):
        load_rsa_public_key("ssh-rsa not-base64")


def test_peer_id_is_the_libp2p_id_of_the_identity_key(tmp_path: Path) -> None:
    from hivemind.p2p import PeerID

    from worker.admission.authorizer import ensure_identity, load_identity

    path = tmp_path / "identity.key"
    ensure_identity(path)
    key, peer_id = load_identity(path)
    assert peer_id == PeerID.from_identity(path.read_bytes()).to_base58()
    assert peer_id_of(key.get_public_key().to_bytes().decode()) == peer_id


def test_the_authority_key_is_made_once_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "data" / "swarm_authority.pem"
    first = load_or_create_key(path)
    assert path.stat().st_mode & 0o777 == 0o600
    again = load_or_create_key(path)
    assert openssh_public_key(first.public_key()) == openssh_public_key(again.public_key())


def test_runs_use_admission_unless_the_spec_says_false() -> None:
    assert swarm_admission_requested({})
    assert swarm_admission_requested({"swarm_admission": True})
    assert not swarm_admission_requested({"swarm_admission": False})
    assert swarm_admission_requested({"swarm_admission": "false"})  # only the JSON literal false opts out


class FlakyOrchestrator:
    """A token source whose answers the test switches between a fresh token and an outage."""

    def __init__(self, authority: SwarmAuthority, swarm_id: str) -> None:
        self.authority, self.swarm_id = authority, swarm_id
        self.up, self.calls = True, 0
        self.now = time.time()

    def __call__(self, public_key: str) -> SwarmToken:
        from worker.admission.authorizer import SwarmTokenUnavailable

        self.calls += 1
        if not self.up:
            raise SwarmTokenUnavailable("orchestrator down")
        return self.authority.grant(self.swarm_id, "worker-1", public_key, self.now)


def test_the_worker_renews_at_half_life_and_keeps_its_token_in_an_outage(authority_key, tmp_path) -> None:
    from worker.admission.access_tokens import from_access_token
    from worker.admission.authorizer import SwarmAuthorizer, SwarmTokenUnavailable

    source = FlakyOrchestrator(SwarmAuthority(authority_key, ttl_s=100), "run-a")
    clock = [source.now]
    authorizer = SwarmAuthorizer.create(
        "run-a", source, tmp_path / "id.key", clock=lambda: clock[0], retry_interval_s=10
    )
    first = authorizer.current_token()

    async def scenario() -> None:
        assert not authorizer.does_token_need_refreshing(first)
        clock[0] += 51  # past half-life: renewed in the background, the valid token is used meanwhile
        source.now = clock[0]
        await authorizer.refresh_token_if_needed()
        await authorizer.wait_for_renewal()
        renewed = authorizer.current_token()
        assert from_access_token(renewed).expires_at() > from_access_token(first).expires_at()
        source.up = False
        clock[0] += 51  # outage: the renewal fails, the still valid token stays
        await authorizer.refresh_token_if_needed()
        await authorizer.wait_for_renewal()
        assert authorizer.current_token() == renewed
        calls = source.calls
        await authorizer.refresh_token_if_needed()  # no new attempt before retry_interval_s
        await authorizer.wait_for_renewal()
        assert source.calls == calls
        clock[0] += 50  # the token has expired and the orchestrator is still away
        with pytest.raises(SwarmTokenUnavailable):
            await authorizer.refresh_token_if_needed()

    asyncio.run(scenario())


def test_the_orchestrator_peer_stores_nothing_for_workers_and_reads_only_their_own_run() -> None:
    from hivemind.dht.routing import DHTID
    from hivemind.proto import dht_pb2

    from orchestrator.swarm.peer_authorizer import _empty_store, _values_only_for

    store = dht_pb2.StoreRequest(
        keys=[b"k"], subkeys=[b"s"], values=[b"v"], expiration_time=[NOW], in_cache=[False]
    )
    _empty_store(store)
    assert not store.keys and not store.values and not store.expiration_time
    own = DHTID.generate(source="run-a_progress").to_bytes()
    other = DHTID.generate(source="run-b_progress").to_bytes()
    found = dht_pb2.FindResult(type=dht_pb2.FOUND_DICTIONARY, value=b"x")
    missing = dht_pb2.FindResult(type=dht_pb2.NOT_FOUND)
    request = dht_pb2.FindRequest(keys=[own, other])
    assert _values_only_for(request, dht_pb2.FindResponse(results=[found, missing]), frozenset({"run-a"}))
    assert not _values_only_for(request, dht_pb2.FindResponse(results=[missing, found]), frozenset({"run-a"}))
    assert _values_only_for(request, dht_pb2.FindResponse(results=[missing, found]), None)
