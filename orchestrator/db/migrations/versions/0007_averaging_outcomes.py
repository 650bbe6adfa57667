"""Averaging outcomes: each worker's counts, the run's totals in progress samples, the run's window.

- ``workers.averaging``: the outcome counts of the worker's latest heartbeat (JSON; null: not reported).
- ``progress_samples.averaging``: the run's counts summed over its workers at the sample (null before).
- ``runs.averaging``: the run's averaged fraction over the recent window and its warning (JSON; null
  until judged).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("workers", "progress_samples", "runs"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("averaging", sa.JSON(), nullable=True))


def downgrade() -> None:
    for table in ("runs", "progress_samples", "workers"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("averaging")
