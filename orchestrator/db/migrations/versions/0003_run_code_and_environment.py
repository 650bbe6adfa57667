"""A run's code package, requirements and environment variables.

- ``runs.workdir``: the SHA-256 of the run's code package in the store (null: the run imports what the
  workers have), indexed: a package is deleted with the last run that names it.
- ``runs.requirements``: the lines of the requirements file each worker installs (JSON list).
- ``runs.env`` and ``runs.secret_env``: environment variables of the run's code (JSON objects); the API
  never returns the secret values.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("workdir", sa.String(64), nullable=True))
        batch.add_column(sa.Column("requirements", sa.JSON(), nullable=False, server_default="[]"))
        batch.add_column(sa.Column("env", sa.JSON(), nullable=False, server_default="{}"))
        batch.add_column(sa.Column("secret_env", sa.JSON(), nullable=False, server_default="{}"))
        batch.create_index("ix_runs_workdir", ["workdir"])


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_index("ix_runs_workdir")
        batch.drop_column("secret_env")
        batch.drop_column("env")
        batch.drop_column("requirements")
        batch.drop_column("workdir")
