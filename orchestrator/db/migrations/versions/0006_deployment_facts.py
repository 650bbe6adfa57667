"""Facts every orchestrator on the database must agree on.

- ``deployment_facts``: one row per fact (``name``, ``value``, ``recorded_at``). The first is
  ``swarm_authority_public_key``: orchestrators sharing a database (the HA set-up) must sign swarm tokens
  with one key, or the swarm splits between the workers each one admitted.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "deployment_facts",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("deployment_facts")
