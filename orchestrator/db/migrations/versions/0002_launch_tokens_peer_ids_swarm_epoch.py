"""Launch tokens apart from worker tokens, token-bound peer ids, and the swarm epoch the DHT showed.

- ``workers.launch_token_hash``: the one-time token a launched worker registers with (its worker token
  is issued at registration; the launch token stops working once the worker has used its worker token).
  Rows written before this revision keep their token as worker token and get no launch token.
- ``workers.peer_id``: the libp2p peer id the worker's swarm token was issued for; heartbeat addresses
  must carry it.
- ``runs.swarm_epoch``: the highest swarm epoch the orchestrator's DHT reader saw for the run; the stop
  condition and the checkpoint epochs are judged by it, never by what workers report about themselves.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("launch_token_hash", sa.String(64), nullable=True))
        batch.add_column(sa.Column("peer_id", sa.String(128), nullable=True))
        batch.create_unique_constraint("uq_workers_launch_token_hash", ["launch_token_hash"])
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("swarm_epoch", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("swarm_epoch")
    with op.batch_alter_table("workers") as batch:
        batch.drop_constraint("uq_workers_launch_token_hash", type_="unique")
        batch.drop_column("peer_id")
        batch.drop_column("launch_token_hash")
