"""Alembic environment: runs over a connection handed in by ``orchestrator.db.session.upgrade`` or over
``sqlalchemy.url`` (set by ``alembic_config(url)`` or ``SPOTSWARM_DATABASE_URL`` for the alembic CLI).

``render_as_batch`` keeps future ALTERs working on SQLite, which cannot alter most columns in place.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import Connection

from orchestrator.db.models import Base
from orchestrator.db.session import make_engine

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("SPOTSWARM_DATABASE_URL")
    if not url:
        raise RuntimeError("no database URL: set sqlalchemy.url or SPOTSWARM_DATABASE_URL")
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise RuntimeError("offline (--sql) migrations are not supported; run `spotswarm db upgrade`")
run_migrations_online()
