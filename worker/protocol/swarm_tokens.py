"""The wire models of swarm admission (docs/concepts/swarm-admission.md): a worker asks for a swarm
token for its peer's key, and anyone may read whether the orchestrator admits peers by token.

The tokens themselves (signing, checking) are :mod:`worker.admission.tokens`.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from worker.protocol.validators import StrictModel


class SwarmTokenRequest(StrictModel):
    """``POST /workers/{worker_id}/swarm-token`` (worker token): the public key of the worker's peer."""

    public_key: str = Field(
        min_length=64, max_length=2048, description="The peer's RSA public key, OpenSSH format (ssh-rsa ...)."
    )


class SwarmToken(BaseModel):
    """A signed, short-lived right to take part in one run's swarm (a hivemind ``AccessToken``)."""

    username: str = Field(description="`<swarm id>/<subject>`: the run's swarm and who holds the token.")
    public_key: str = Field(description="The holder's public key (its hivemind peer id derives from it).")
    expiration_time: str = Field(description="ISO-8601 UTC time after which peers reject the token.")
    signature: str = Field(description="The orchestrator's signature (base64) over the three fields above.")
    swarm_id: str
    peer_id: str = Field(description="The libp2p peer id of `public_key`.")
    authority_public_key: str = Field(description="The orchestrator's token-signing key, OpenSSH format.")


class SwarmAuthInfo(BaseModel):
    """``GET /swarm-auth``: whether this orchestrator admits peers by token, and the key peers verify with."""

    enabled: bool
    authority_public_key: str | None = None
    token_ttl_s: float | None = None
    open_swarms: list[str] = Field(
        default_factory=list, description="Active runs that opted out: their peers need no token."
    )
