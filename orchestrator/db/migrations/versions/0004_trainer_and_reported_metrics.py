"""A run's trainer section and reported metrics; each worker's latest metrics; metrics in progress samples.

- ``runs.trainer``: the run spec's ``trainer`` section (JSON; ``{}`` is Lightning's defaults).
- ``runs.report_metrics``: the names or glob patterns of the metrics its workers report (JSON list); runs
  created before this revision get the default list.
- ``runs.final_loss``, ``runs.final_metrics``: what the run's workers reported last, kept when it
  finishes (null for runs that finished before this revision).
- ``workers.metrics``: the latest reported values (JSON object, name -> number).
- ``progress_samples.metrics``: the run's aggregated values at the sample (null in older samples).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# worker/protocol/trainer.py DEFAULT_REPORT_METRICS as of this revision (a migration never imports app code)
DEFAULT_REPORT_METRICS = ["train_loss", "loss", "train/loss", "val_*"]


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("trainer", sa.JSON(), nullable=False, server_default="{}"))
        batch.add_column(
            sa.Column(
                "report_metrics",
                sa.JSON(),
                nullable=False,
                server_default=json.dumps(DEFAULT_REPORT_METRICS),
            )
        )
        batch.add_column(sa.Column("final_loss", sa.Float(), nullable=True))
        batch.add_column(sa.Column("final_metrics", sa.JSON(), nullable=True))
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("metrics", sa.JSON(), nullable=False, server_default="{}"))
    with op.batch_alter_table("progress_samples") as batch:
        batch.add_column(sa.Column("metrics", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("progress_samples") as batch:
        batch.drop_column("metrics")
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("metrics")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("final_metrics")
        batch.drop_column("final_loss")
        batch.drop_column("report_metrics")
        batch.drop_column("trainer")
