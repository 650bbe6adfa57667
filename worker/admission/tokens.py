"""Swarm tokens: what the orchestrator signs and what every peer checks (no hivemind import here).

A swarm token is the content of hivemind's ``AccessToken`` (``username``, ``public_key``,
``expiration_time``, ``signature``) with spotswarm's meaning:

- ``username`` is ``<swarm id>/<subject>``: the run's swarm (hivemind ``run_id``) and who holds the
  token (``worker-<id>``). The orchestrator's own DHT peer holds ``*/orchestrator``: it serves every run.
- ``public_key`` is the holder's RSA public key in OpenSSH form, the same key as its libp2p identity,
  so the holder's peer id derives from it (:func:`peer_id_of`).
- ``expiration_time`` is an ISO-8601 UTC time; peers reject the token after it.
- ``signature`` is the orchestrator's RSA-PSS/SHA-256 signature (base64) over the three fields above,
  prefixed with a domain string so that no other signed message can pass for a token.

:class:`TokenVerifier` holds the orchestrator's public key and one swarm id and says what is wrong with
a token, if anything. Both sides import this module; it needs only ``cryptography`` and ``base58``.
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import base58
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

ANY_SWARM = "*"
ORCHESTRATOR_SUBJECT = "orchestrator"
MIN_RSA_BITS = 2048
_DOMAIN = b"spotswarm swarm token v1"
_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.MAX_LENGTH)


class SwarmTokenError(ValueError):
    """A token (or a key in it) that cannot be used; the message says why."""


@dataclass(frozen=True)
class TokenFields:
    """The four fields of a hivemind ``AccessToken``, as text."""

    username: str
    public_key: str
    expiration_time: str
    signature: str

    @property
    def swarm_id(self) -> str:
        return split_username(self.username)[0]

    @property
    def subject(self) -> str:
        return split_username(self.username)[1]

    def expires_at(self) -> float:
        """Expiration as a UNIX time; raises :class:`SwarmTokenError` when unreadable."""
        return parse_expiration(self.expiration_time)


def token_username(swarm_id: str, subject: str) -> str:
    """``<swarm id>/<subject>``; raises :class:`SwarmTokenError` for parts holding ``/`` or blanks."""
    for part in (swarm_id, subject):
        if not part or "/" in part or any(ch.isspace() for ch in part):
            raise SwarmTokenError(f"bad token username part {part!r}")
    return f"{swarm_id}/{subject}"


def split_username(username: str) -> tuple[str, str]:
    """``(swarm id, subject)`` of a token username; raises :class:`SwarmTokenError` when malformed."""
    swarm_id, sep, subject = username.partition("/")
    if not sep or not swarm_id or not subject or "/" in subject:
        raise SwarmTokenError(f"malformed token username {username!r}")
    return swarm_id, subject


def format_expiration(unix_time: float) -> str:
    return datetime.fromtimestamp(unix_time, UTC).isoformat()


def parse_expiration(text: str) -> float:
    try:
        when = datetime.fromisoformat(text)
    except ValueError as exc:
        raise SwarmTokenError(f"unreadable expiration time {text!r}") from exc
    if when.tzinfo is None:
        raise SwarmTokenError(f"expiration time {text!r} has no time zone")
    return when.timestamp()


def signed_bytes(username: str, public_key: str, expiration_time: str) -> bytes:
    """The exact bytes the orchestrator signs. Fields may not hold newlines (they separate them)."""
    parts = (username, public_key, expiration_time)
    if any("\n" in part for part in parts):
        raise SwarmTokenError("token fields may not contain newlines")
    return b"\n".join([_DOMAIN, *(part.encode() for part in parts)])


def load_rsa_public_key(openssh: str) -> rsa.RSAPublicKey:
    """Parse an OpenSSH ``ssh-rsa`` key of at least 2048 bits; raises :class:`SwarmTokenError`."""
    try:
        key = serialization.load_ssh_public_key(openssh.strip().encode())
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise SwarmTokenError(f"not an OpenSSH public key: {str(exc)[:200]}") from exc
    if not isinstance(key, rsa.RSAPublicKey):
        raise SwarmTokenError("swarm peers use RSA keys (hivemind's identity keys)")
    if key.key_size < MIN_RSA_BITS:
        raise SwarmTokenError(f"RSA key of {key.key_size} bits; at least {MIN_RSA_BITS} needed")
    return key


def openssh_public_key(key: rsa.RSAPublicKey) -> str:
    return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


def peer_id_of(openssh: str) -> str:
    """The libp2p peer id (base58) of the peer whose identity key has this public key.

    libp2p hashes the protobuf ``PublicKey{key_type: RSA (0), data: DER SubjectPublicKeyInfo}`` with
    SHA-256 and wraps the digest as a multihash (code 0x12, length 0x20).
    """
    der = load_rsa_public_key(openssh).public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    encoded = b"\x08\x00\x12" + _varint(len(der)) + der
    return base58.b58encode(b"\x12\x20" + hashlib.sha256(encoded).digest()).decode()


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def sign_token(
    authority: rsa.RSAPrivateKey, swarm_id: str, subject: str, public_key: str, expires_at: float
) -> TokenFields:
    """A token for ``public_key`` in ``swarm_id`` until ``expires_at`` (UNIX time), signed by ``authority``.

    Raises :class:`SwarmTokenError` for a key that is not RSA of 2048 bits or more, or a bad username.
    """
    load_rsa_public_key(public_key)
    username = token_username(swarm_id, subject)
    public_key = public_key.strip()
    expiration = format_expiration(expires_at)
    raw = authority.sign(signed_bytes(username, public_key, expiration), _PSS, hashes.SHA256())
    return TokenFields(username, public_key, expiration, base64.b64encode(raw).decode())


class TokenVerifier:
    """Checks tokens against the orchestrator's public key, one swarm (None: any) and the clock.

    ``accept_orchestrator``: also accept the orchestrator's own ``*/orchestrator`` token (DHT traffic);
    averaging handlers do not. ``clock`` returns UNIX time (hivemind's DHT time is the same clock).
    """

    def __init__(
        self,
        authority_public_key: str,
        swarm_id: str | None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.authority_public_key = authority_public_key.strip()
        self._authority = load_rsa_public_key(self.authority_public_key)
        self.swarm_id = swarm_id
        self._clock = clock

    def problem(self, token: TokenFields, *, accept_orchestrator: bool = True) -> str | None:
        """Why ``token`` must be refused here, or None when it is valid now."""
        try:
            swarm_id, subject = split_username(token.username)
            expires_at = token.expires_at()
            signed = signed_bytes(token.username, token.public_key, token.expiration_time)
            signature = base64.b64decode(token.signature, validate=True)
        except (SwarmTokenError, ValueError) as exc:
            return f"malformed token: {exc}"
        try:
            self._authority.verify(signature, signed, _PSS, hashes.SHA256())
        except InvalidSignature:
            return "not signed by this orchestrator"
        orchestrator = swarm_id == ANY_SWARM and subject == ORCHESTRATOR_SUBJECT
        if swarm_id == ANY_SWARM and not orchestrator:
            return "only the orchestrator's token may name every swarm"
        if orchestrator and not accept_orchestrator:
            return "the orchestrator's token does not admit to averaging"
        if self.swarm_id is not None and swarm_id != self.swarm_id and not orchestrator:
            return f"token for swarm {swarm_id!r}, not {self.swarm_id!r}"
        if expires_at <= self._clock():
            return f"token expired at {token.expiration_time}"
        return None

    def problem_for_peer(self, token: TokenFields, peer_id: str) -> str | None:
        """:meth:`problem` (orchestrator token refused), plus: the token's key must be ``peer_id``'s."""
        reason = self.problem(token, accept_orchestrator=False)
        if reason is not None:
            return reason
        try:
            holder = peer_id_of(token.public_key)
        except SwarmTokenError as exc:
            return f"unusable key in token: {exc}"
        if holder != peer_id:
            return f"token belongs to peer {holder}, presented by {peer_id}"
        return None
