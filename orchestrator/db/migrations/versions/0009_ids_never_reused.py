"""Run and worker ids are never handed out again: SQLite's ``runs`` and ``workers`` become ``AUTOINCREMENT``
tables.

An ``INTEGER PRIMARY KEY`` without ``AUTOINCREMENT`` is SQLite's rowid, and a new row gets the largest
rowid plus one: once the run (or worker) holding the largest id is deleted, the next one gets that id
again. After ``runs delete`` the next run's workers then carried the deleted run's worker ids, which made
logs, events, ``--worker ID`` and anything a worker keeps per id ambiguous. With ``AUTOINCREMENT`` SQLite
remembers the largest id ever used (``sqlite_sequence``) and never goes below it. PostgreSQL's sequences
never reuse a value: nothing to do there.

The tables are rebuilt (SQLite cannot add ``AUTOINCREMENT`` in place) with their rows, ids and indexes;
``orchestrator.db.session.upgrade`` turns foreign keys off around the migrations, so dropping the old
``runs`` table does not cascade to the rows that name it, and checks them afterwards.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

TABLES = ("runs", "workers")


def _rebuild(autoincrement: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table in TABLES:
        with op.batch_alter_table(
            table, recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}
        ):
            pass


def upgrade() -> None:
    _rebuild(autoincrement=True)


def downgrade() -> None:
    _rebuild(autoincrement=False)
