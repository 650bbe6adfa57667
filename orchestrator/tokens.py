"""Bearer tokens: made here, stored only as SHA-256 digests, compared in constant time.

Each kind carries a prefix so a token's role shows at a glance (and in logs, which never print one):
``ssa_`` admin, ``ssj_`` a run's join token, ``ssl_`` a launch token (issued with a launch intent, so a
launched worker can register without the run's join token; void once the worker has used the worker
token its registration returned), ``ssw_`` a worker token.
Tokens have 256 bits of entropy, so an unsalted SHA-256 is enough to make the stored digest useless.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

JOIN_PREFIX = "ssj_"
LAUNCH_PREFIX = "ssl_"
WORKER_PREFIX = "ssw_"
NON_ADMIN_PREFIXES = (JOIN_PREFIX, LAUNCH_PREFIX, WORKER_PREFIX)


def new_token(prefix: str) -> str:
    """A fresh random token with ``prefix``."""
    return prefix + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """The hex SHA-256 stored in place of ``token``."""
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(token: str, digest: str | None) -> bool:
    """Whether ``token`` hashes to ``digest``, in constant time; False when no digest is stored."""
    if digest is None:
        return False
    return hmac.compare_digest(hash_token(token), digest)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None when absent or malformed."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()
