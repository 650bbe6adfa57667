"""Engine, sessions and migrations for SQLite (default) and PostgreSQL (``postgresql+psycopg://``).

Use one :class:`Database` per process. Each unit of work is ``with db.begin() as session: ...``: it
commits on success and rolls back on an exception. SQLite runs in WAL mode with foreign keys on and a
busy timeout, so the API threads and the heartbeat flusher can write concurrently.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

logger = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 10_000
WRITE_OPTION = "spotswarm_write"
# PostgreSQL advisory lock held while migrating (any fixed 64-bit number no other lock of ours uses).
MIGRATION_LOCK_KEY = 0x5350_4F54_4D49_4752


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # Let SQLAlchemy, not the sqlite3 module, decide when transactions begin (see _sqlite_begin).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    _switch_to_wal(cursor)
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _switch_to_wal(cursor: Any) -> None:
    # Switching a new file to WAL needs its exclusive lock. Two processes opening the file at once (two
    # orchestrators starting together) both hold a shared lock and want it; SQLite answers one of them
    # "database is locked" at once, without the busy timeout, to avoid a deadlock. That one retries.
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


def _sqlite_begin(connection: Connection) -> None:
    # A write transaction takes the write lock up front (BEGIN IMMEDIATE) and so waits on the busy
    # timeout; a deferred one that upgrades from read to write would fail at once with "locked".
    if connection.get_execution_options().get(WRITE_OPTION):
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    else:
        connection.exec_driver_sql("BEGIN")


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite files get their parent directory created and the pragmas set."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20, pool_timeout=10)


def alembic_config(url: str | None = None) -> Config:
    """An alembic Config that works from an installed package (no alembic.ini needed)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply migrations up to ``revision`` over ``engine``'s database. Raises on a failed migration.

    Orchestrators that share a database (the HA set-up) start together and each migrates at start-up:
    the migration holds a database-wide lock for its transaction (PostgreSQL: an advisory lock; SQLite:
    the write lock, taken up front), so the first one migrates and the others find the schema at head.
    """
    config = alembic_config()
    sqlite = engine.dialect.name == "sqlite"
    locked = engine.execution_options(**{WRITE_OPTION: True}) if sqlite else engine
    with locked.connect() as connection, _foreign_keys_off(connection, sqlite), connection.begin():
        if not sqlite:
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
        if sqlite:
            _check_foreign_keys(connection)


@contextmanager
def _foreign_keys_off(connection: Connection, sqlite: bool) -> Iterator[None]:
    """SQLite's foreign keys off while migrating: a migration that rebuilds a table (SQLite cannot alter
    most of a table in place) drops the old one, and with foreign keys on that drop would first delete,
    by cascade, every row naming it. The pragma only takes effect outside a transaction."""
    if not sqlite:
        yield
        return
    raw = connection.connection.dbapi_connection
    assert raw is not None
    raw.execute("PRAGMA foreign_keys=OFF")
    try:
        yield
    finally:
        raw.execute("PRAGMA foreign_keys=ON")


def _check_foreign_keys(connection: Connection) -> None:
    """Raise (rolling the migration back) when a migration left a row naming a missing one."""
    broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
    if broken:
        raise RuntimeError(f"the migration left rows whose foreign keys name no row: {broken[:5]}")


class Database:
    """The engine and session factory of one database."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        # A read sees one snapshot: PostgreSQL's default (read committed) gives each statement its own, so
        # a view's two queries could straddle a heartbeat (its samples without its loss). SQLite's deferred
        # read transaction keeps one snapshot already.
        readers = self.engine
        if self.engine.dialect.name == "postgresql":
            readers = self.engine.execution_options(isolation_level="REPEATABLE READ")
        self._sessions = sessionmaker(readers, expire_on_commit=False)
        self._write_sessions = sessionmaker(
            self.engine.execution_options(**{WRITE_OPTION: True}), expire_on_commit=False
        )
        self._writers = threading.RLock() if self.engine.dialect.name == "sqlite" else None

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def upgrade(self) -> None:
        """Bring the schema to the newest migration."""
        upgrade(self.engine)
        logger.info("database schema up to date (%s)", self.dialect)

    @contextmanager
    def begin(self) -> Iterator[Session]:
        """A session in a transaction: commit on success, roll back on an exception.

        On SQLite (one writer at a time) this process's writers queue on a lock first: SQLite's own busy
        wait polls, and under load (thousands of registrations) a writer could starve past the busy
        timeout ("database is locked", a 503) while others came and went.
        """
        with self._writers or nullcontext(), self._write_sessions() as session, session.begin():
            yield session

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A session for read-only work, closed at the end: one snapshot throughout (a deferred transaction
        on SQLite, repeatable read on PostgreSQL)."""
        with self._sessions() as session:
            yield session

    def ping(self) -> None:
        """Run ``SELECT 1``; raises ``sqlalchemy.exc.SQLAlchemyError`` when the database is unreachable."""
        with self.engine.connect() as connection:
            connection.execute(text("SELECT 1"))

    def close(self) -> None:
        self.engine.dispose()
