"""Swarm tokens in hivemind's form: its ``AccessToken`` protobuf <-> :class:`~.tokens.TokenFields`.

The authorizer signs DHT calls with an ``AccessToken``, the guard and the orchestrator's peer authorizer
read the fields of the ones they receive. Below both, so that neither imports the other for it.
"""

from __future__ import annotations

from hivemind.proto.auth_pb2 import AccessToken

from worker.admission.tokens import TokenFields
from worker.protocol.swarm_tokens import SwarmToken


def to_access_token(token: TokenFields | SwarmToken) -> AccessToken:
    return AccessToken(
        username=token.username,
        public_key=token.public_key.encode(),
        expiration_time=token.expiration_time,
        signature=token.signature.encode(),
    )


def from_access_token(token: AccessToken) -> TokenFields:
    """The text fields of a hivemind token (undecodable bytes become replacement characters)."""
    return TokenFields(
        username=token.username,
        public_key=token.public_key.decode(errors="replace"),
        expiration_time=token.expiration_time,
        signature=token.signature.decode(errors="replace"),
    )
