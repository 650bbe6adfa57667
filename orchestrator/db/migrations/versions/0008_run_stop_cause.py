"""Why a run stopped, as a column: ``runs.stop_cause`` (``target_reached``, ``user`` or ``failed``; null
while the run has not been asked to stop and has not failed).

Before this revision a stopping run ended ``completed`` rather than ``stopped`` when its ``state_reason``
read "stop condition reached" (the reconcile loop's reason). Existing rows are filled in once, from
their state and that text:

- ``stopping``: ``target_reached`` with that reason, else ``user`` (only an admin stops a run otherwise);
- ``completed``: ``target_reached``; ``stopped``: ``user``; ``failed``: ``failed``;
- ``pending`` and ``running``: null.

The column holds short strings like ``state`` (no CHECK constraint, no native enum type).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_BACKFILL = sa.text(
    """
    UPDATE runs SET stop_cause = CASE
        WHEN state = 'stopping' AND state_reason = 'stop condition reached' THEN 'target_reached'
        WHEN state = 'stopping' THEN 'user'
        WHEN state = 'completed' THEN 'target_reached'
        WHEN state = 'stopped' THEN 'user'
        WHEN state = 'failed' THEN 'failed'
    END
    """
)


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("stop_cause", sa.String(16), nullable=True))
    op.execute(_BACKFILL)


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("stop_cause")
