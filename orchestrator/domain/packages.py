"""Runs' code packages that no run names, removed: a package whose create was refused at once, and any
other (an upload whose create never came, a crash between the two) by a sweep once it is older than a
grace period.

A package is uploaded before the run that names it is created, so "no run names it" is also the state of
every package whose create is in progress. :class:`PackageClaims` holds those (in this process): neither a
refusal nor the sweep removes a package another create is checking. The grace period covers the rest:
the time between a CLI's upload and its create, and creates on another replica.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Run
from orchestrator.db.session import Database
from orchestrator.storage.base import PACKAGES_PREFIX, CheckpointStore, package_key

logger = logging.getLogger(__name__)


class PackageClaims:
    """The packages creates in progress are checking (thread-safe: creates run in worker threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: Counter[str] = Counter()

    @contextlib.contextmanager
    def claim(self, digest: str | None) -> Iterator[None]:
        """Hold ``digest`` (nothing for None) while the block runs."""
        if digest is None:
            yield
            return
        with self._lock:
            self._held[digest] += 1
        try:
            yield
        finally:
            with self._lock:
                self._held[digest] -= 1
                if self._held[digest] <= 0:
                    del self._held[digest]

    def held(self, digest: str) -> bool:
        with self._lock:
            return self._held[digest] > 0


def named(session: Session, digest: str) -> bool:
    """Whether a run names the package ``digest``."""
    return session.scalar(select(Run.id).where(Run.workdir == digest).limit(1)) is not None


def forget_if_unnamed(db: Database, store: CheckpointStore, claims: PackageClaims, digest: str) -> bool:
    """Delete the package ``digest`` unless a run names it or a create holds it (after a refused create:
    the package it brought stays stored for nothing otherwise). True when deleted."""
    if claims.held(digest):
        return False
    with db.read() as session:
        if named(session, digest):
            return False
    store.delete(package_key(digest))
    logger.info("package %s: deleted, its create was refused and no run names it", digest[:12])
    return True


def sweep_orphans(
    db: Database, store: CheckpointStore, claims: PackageClaims, now: datetime, grace_s: float
) -> list[str]:
    """Delete the packages no run names that were stored more than ``grace_s`` before ``now``; returns
    their digests."""
    stored = store.stored_since(PACKAGES_PREFIX)
    old = {key: at for key, at in stored.items() if now - at > timedelta(seconds=grace_s)}
    digests = {key: key.removeprefix(PACKAGES_PREFIX).removesuffix(".tar.gz") for key in old}
    if not digests:
        return []
    with db.read() as session:
        in_use = set(session.scalars(select(Run.workdir).where(Run.workdir.in_(list(digests.values())))))
    deleted = []
    for key, digest in digests.items():
        if digest in in_use or claims.held(digest) or key != package_key(digest):
            continue
        store.delete(key)
        deleted.append(digest)
        logger.info("package %s: deleted, no run names it (stored %s)", digest[:12], old[key].isoformat())
    return deleted
