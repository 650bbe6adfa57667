"""What a run trusts its hand-joined workers with (workers registered with its join token).

- ``runs.hand_joined_checkpoint``: whether a hand-joined worker may be elected the run's checkpointer
  (and then only while no launched worker can be). False for existing runs: a join token holder could
  otherwise upload the checkpoint every launched worker resumes from.
- ``runs.hand_joined_secrets``: whether a hand-joined worker's registration carries the values of the
  run's ``secret_env``. True for existing runs: what they did before this revision.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # plain ADD COLUMNs: a batch rebuild of ``runs`` on SQLite would drop its AUTOINCREMENT (0009)
    op.add_column(
        "runs", sa.Column("hand_joined_checkpoint", sa.Boolean(), nullable=False, server_default=sa.false())
    )
    op.add_column(
        "runs", sa.Column("hand_joined_secrets", sa.Boolean(), nullable=False, server_default=sa.true())
    )


def downgrade() -> None:
    with op.batch_alter_table("runs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_column("hand_joined_secrets")
        batch.drop_column("hand_joined_checkpoint")
