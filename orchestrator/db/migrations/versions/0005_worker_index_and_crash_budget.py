"""Each worker's stable index; a run's crash budget.

- ``workers.worker_index``: the slot a worker holds among its run's live workers (null for workers that
  registered before this revision or never registered).
- ``runs.max_worker_crashes``: the run spec's crash budget (null: the server's default).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("max_worker_crashes", sa.Integer(), nullable=True))
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("worker_index", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("worker_index")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("max_worker_crashes")
