"""Facts every orchestrator on one database must agree on, recorded by the first one to start.

The swarm authority's public key is the first: orchestrators that share a database (the HA set-up) each sign
swarm tokens, and a worker trusts only the key of its first token (``worker/admission/authorizer.py``). Two
keys would split a run's swarm between the workers each orchestrator admitted, with every averaging call
between the halves refused, and renewals from the other orchestrator refused too. So the first orchestrator
records its key; one with another key refuses to start and says which file to copy.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy.exc import IntegrityError

from orchestrator.db.models import DeploymentFact
from orchestrator.db.session import Database

AUTHORITY_FACT = "swarm_authority_public_key"


class AuthorityMismatch(Exception):
    """This orchestrator's swarm authority key is not the one its database's deployment uses."""


def claim_authority(db: Database, public_key: str, key_path: Path) -> None:
    """Record ``public_key`` as the deployment's swarm authority, or check it is the recorded one."""
    recorded = _recorded(db)
    if recorded is None:
        try:
            with db.begin() as session:
                now = datetime.now(UTC)
                session.add(DeploymentFact(name=AUTHORITY_FACT, value=public_key, recorded_at=now))
        except IntegrityError:  # another orchestrator recorded its key first: compare with that one
            pass
        recorded = _recorded(db)
    if recorded != public_key:
        raise AuthorityMismatch(
            f"the swarm authority key {key_path} is not the one this database's orchestrators use "
            f"({_short(recorded)}, this one {_short(public_key)}): orchestrators sharing a database must "
            "sign swarm tokens with one key; copy the first orchestrator's swarm_authority.pem here (or "
            "point SPOTSWARM_SWARM_AUTHORITY_KEY_FILE at it)"
        )


def _recorded(db: Database) -> str | None:
    with db.begin() as session:
        fact = session.get(DeploymentFact, AUTHORITY_FACT)
        return fact.value if fact is not None else None


def _short(public_key: str | None) -> str:
    """The key's last characters, enough to tell two keys apart in a message."""
    return f"...{(public_key or '')[-12:]}"
