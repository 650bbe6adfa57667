"""Swarm tokens in hivemind's form: its ``AccessToken`` protobuf <-> :class:`~.tokens.TokenFields`.

The authorizer signs DHT calls with an ``AccessToken``, the guard and the orchestrator's peer authorizer
read the fields of the ones they receive. Below both, so that neither imports the other for it; both
authorizers check a token they receive with :func:`is_valid_access_token`.
"""

from __future__ import annotations

import logging

from hivemind.proto.auth_pb2 import AccessToken

from worker.admission.tokens import TokenFields, TokenVerifier
from worker.protocol.swarm_tokens import SwarmToken

logger = logging.getLogger(__name__)


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


def is_valid_access_token(verifier: TokenVerifier, access_token: AccessToken) -> bool:
    """Whether ``verifier`` accepts ``access_token`` (hivemind's ``is_token_valid`` of an authorizer); a
    refused token is logged at debug level with the reason."""
    reason = verifier.problem(from_access_token(access_token))
    if reason is not None:
        logger.debug("refusing swarm token of %r: %s", access_token.username, reason)
    return reason is None
