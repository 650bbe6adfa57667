"""Who runs the reconcile loop when several orchestrators share one database: exactly one, the leader.

Two orchestrators on one PostgreSQL database (behind one address, for availability) both serve the API,
but two reconcile loops would each see a run short of workers and each launch the missing ones. The
reconciler service therefore ticks only while :meth:`LeaderElection.check` says this process leads; the
others stand by and call ``check`` every tick, so one of them takes over within a tick of the lock's
release.

The lock is tied to the leader's life, not to a lease it must renew:

- **PostgreSQL**: a session-level ``pg_try_advisory_lock`` held on a dedicated connection. The server
  releases it the moment that session ends: at once when the leader's process dies (its socket closes),
  within the TCP keepalive (about 11 s, set on the connection) when its machine or network does. Each
  check also confirms, through ``pg_locks``, that this very session still holds it (a restarted
  database, or a transaction-mode pooler in between, would otherwise go unnoticed).
- **SQLite** (one machine): an exclusive ``flock`` on ``<database file>.leader``, released by the kernel
  when the process dies. Two orchestrators on one SQLite file work the same way.

Why not a lease row with an expiry: it needs no table, and a dead leader is replaced within a tick
instead of after a lease period, with no clocks to compare. The price is one idle database connection.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path
from typing import Protocol

from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

logger = logging.getLogger(__name__)

# The advisory lock's two 32-bit keys: "spotswarm" and "reconcile loop" (advisory locks are per database).
LOCK_CLASS_ID = 0x53505357  # "SPSW"
LOCK_OBJECT_ID = 0x52434C31  # "RCL1"
# The dedicated connection: found dead within ~11 s when the peer vanishes, never waits long on a query.
PG_CONNECT_ARGS = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "connect_timeout": 5,
    "options": "-c statement_timeout=5000",
}


class LeaderElection(Protocol):
    """Decides whether this process runs the reconcile loop."""

    def check(self) -> bool:
        """True while this process leads; tries to become the leader when it does not. Never raises."""
        ...

    def release(self) -> None:
        """Give leadership up (at shutdown) so a standby takes over at its next check."""
        ...


class AlwaysLeader:
    """For a database only this process uses (in-memory SQLite, tests of the loop itself)."""

    def check(self) -> bool:
        return True

    def release(self) -> None:
        pass


class _Transitions:
    """Logs the moments this process gains or loses leadership (once each, not every tick)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.leading: bool | None = None

    def record(self, leading: bool, why: str = "") -> bool:
        if leading != self.leading:
            if leading:
                logger.info("reconcile loop: this orchestrator is the leader (%s)", self.what)
            elif self.leading:
                logger.warning("reconcile loop: leadership lost (%s)%s", self.what, f": {why}" if why else "")
            else:
                logger.info("reconcile loop: standing by, another orchestrator leads (%s)", self.what)
            self.leading = leading
        return leading

    def released(self) -> None:
        """This process gave leadership up on purpose (at shutdown): news, not a problem."""
        if self.leading:
            logger.info("reconcile loop: leadership released (%s)", self.what)
        self.leading = False


class FileLockLeader:
    """Leadership as an exclusive ``flock`` on ``path``; the kernel releases it when the process dies."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._log = _Transitions(f"lock file {self.path}")

    def check(self) -> bool:
        if self._fd is not None:
            return True
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            return self._log.record(False, f"cannot open the lock file: {exc}")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return self._log.record(False)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self._log.record(True)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor of the open file drops the flock
            self._fd = None
            self._log.released()


class PostgresAdvisoryLeader:
    """Leadership as a session advisory lock on a dedicated PostgreSQL connection (see the module doc)."""

    def __init__(self, url: str) -> None:
        self._engine: Engine = create_engine(url, poolclass=NullPool, connect_args=dict(PG_CONNECT_ARGS))
        self._conn: Connection | None = None
        self._held = False
        self._log = _Transitions(f"advisory lock {LOCK_CLASS_ID}/{LOCK_OBJECT_ID}")

    def check(self) -> bool:
        keys = {"classid": LOCK_CLASS_ID, "objid": LOCK_OBJECT_ID}
        try:
            if self._conn is None:
                self._conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            if self._held:
                self._held = bool(self._conn.execute(_STILL_HELD, keys).scalar())
                if not self._held:
                    self._drop()
                    return self._log.record(False, "this session no longer holds the lock")
            else:
                self._held = bool(self._conn.execute(_TRY_LOCK, keys).scalar())
        except SQLAlchemyError as exc:
            self._drop()
            return self._log.record(False, f"database unreachable: {type(exc).__name__}")
        return self._log.record(self._held)

    def _drop(self) -> None:
        """Close the dedicated connection (ending the session releases any lock it still had)."""
        self._held = False
        if self._conn is not None:
            try:
                self._conn.close()
            except SQLAlchemyError as exc:
                logger.debug("closing the leader connection: %s", exc)
            self._conn = None

    def release(self) -> None:
        if self._held and self._conn is not None:
            try:
                self._conn.execute(
                    text("SELECT pg_advisory_unlock(:classid, :objid)"),
                    {"classid": LOCK_CLASS_ID, "objid": LOCK_OBJECT_ID},
                )
            except SQLAlchemyError as exc:
                logger.debug("unlocking: %s", exc)
        self._drop()
        self._log.released()
        self._engine.dispose()


_TRY_LOCK = text("SELECT pg_try_advisory_lock(:classid, :objid)")
_STILL_HELD = text(
    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
    " AND granted AND classid = :classid AND objid = :objid AND objsubid = 2)"
)


def leader_election(database_url: str) -> LeaderElection:
    """The election that fits the database: an advisory lock on PostgreSQL, a file lock next to a SQLite
    file, none for an in-memory database. Raises ValueError for another database kind."""
    url = make_url(database_url)
    backend = url.get_backend_name()
    if backend == "postgresql":
        return PostgresAdvisoryLeader(database_url)
    if backend == "sqlite":
        if not url.database or url.database == ":memory:":
            return AlwaysLeader()
        return FileLockLeader(Path(f"{url.database}.leader"))
    raise ValueError(f"no leader election for {backend} databases; use PostgreSQL or SQLite")
