"""Initial schema: runs, workers, progress samples, checkpoints, events.

Revision ID: 0001
Revises:
Create Date: 2026-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _at(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _run_fk(table: str) -> sa.Column:
    fk = sa.ForeignKey("runs.id", ondelete="CASCADE", name=f"fk_{table}_run_id_runs")
    return sa.Column("run_id", sa.Integer(), fk, nullable=False)


def upgrade() -> None:
    _create_runs()
    _create_workers()
    _create_history()


def _create_runs() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("swarm_id", sa.String(80), nullable=False),
        sa.Column("join_token_hash", sa.String(64), nullable=False),
        sa.Column("module", sa.String(255), nullable=False),
        sa.Column("module_args", sa.JSON(), nullable=False),
        sa.Column("datamodule", sa.String(255), nullable=False),
        sa.Column("datamodule_args", sa.JSON(), nullable=False),
        sa.Column("target_batch_size", sa.BigInteger(), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("strategy_options", sa.JSON(), nullable=False),
        sa.Column("min_workers", sa.Integer(), nullable=False),
        sa.Column("max_workers", sa.Integer(), nullable=False),
        sa.Column("desired_workers", sa.Integer(), nullable=False),
        sa.Column("target_epochs", sa.BigInteger(), nullable=True),
        sa.Column("target_samples", sa.BigInteger(), nullable=True),
        sa.Column("checkpoint_every_epochs", sa.Integer(), nullable=False),
        sa.Column("keep_checkpoints", sa.Integer(), nullable=False),
        sa.Column("launcher", sa.String(32), nullable=False),
        sa.Column("launcher_options", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("state_reason", sa.Text(), nullable=False),
        sa.Column("checkpointer_worker_id", sa.Integer(), nullable=True),
        _at("stop_requested_at", nullable=True),
        sa.Column("consecutive_start_failures", sa.Integer(), nullable=False),
        _at("last_start_failure_at", nullable=True),
        _at("created_at"),
        _at("updated_at"),
        _at("started_at", nullable=True),
        _at("finished_at", nullable=True),
        sa.UniqueConstraint("name", name="uq_runs_name"),
        sa.UniqueConstraint("swarm_id", name="uq_runs_swarm_id"),
        sa.UniqueConstraint("join_token_hash", name="uq_runs_join_token_hash"),
    )
    op.create_index("ix_runs_state", "runs", ["state"])


def _create_workers() -> None:
    op.create_table(
        "workers",
        sa.Column("id", sa.Integer(), primary_key=True),
        _run_fk("workers"),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("launcher", sa.String(32), nullable=False),
        sa.Column("launcher_handle", sa.String(128), nullable=True),
        sa.Column("manual", sa.Boolean(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("state_reason", sa.Text(), nullable=False),
        _at("retire_requested_at", nullable=True),
        sa.Column("token_hash", sa.String(64), nullable=True),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("peer_maddrs", sa.JSON(), nullable=False),
        sa.Column("launch_details", sa.JSON(), nullable=False),
        sa.Column("exit_reason", sa.Text(), nullable=True),
        _at("created_at"),
        _at("registered_at", nullable=True),
        _at("last_heartbeat_at", nullable=True),
        _at("ended_at", nullable=True),
        sa.Column("local_step", sa.BigInteger(), nullable=False),
        sa.Column("swarm_epoch", sa.BigInteger(), nullable=False),
        sa.Column("samples", sa.BigInteger(), nullable=False),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("samples_per_s", sa.Float(), nullable=False),
        sa.Column("num_peers", sa.Integer(), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.UniqueConstraint("request_id", name="uq_workers_request_id"),
        sa.UniqueConstraint("token_hash", name="uq_workers_token_hash"),
    )
    op.create_index("ix_workers_run_id_state", "workers", ["run_id", "state"])


def _create_history() -> None:
    op.create_table(
        "progress_samples",
        sa.Column("id", sa.Integer(), primary_key=True),
        _run_fk("progress_samples"),
        _at("at"),
        sa.Column("swarm_epoch", sa.BigInteger(), nullable=False),
        sa.Column("samples_total", sa.BigInteger(), nullable=False),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("samples_per_s", sa.Float(), nullable=False),
        sa.Column("live_workers", sa.Integer(), nullable=False),
        sa.Column("dht_epoch", sa.BigInteger(), nullable=True),
        sa.Column("dht_samples", sa.BigInteger(), nullable=True),
        sa.Column("dht_peers", sa.Integer(), nullable=True),
    )
    op.create_index("ix_progress_samples_run_id_at", "progress_samples", ["run_id", "at"])
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.Integer(), primary_key=True),
        _run_fk("checkpoints"),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        _at("created_at"),
        sa.Column("uploaded_by", sa.Integer(), nullable=True),
        sa.UniqueConstraint("run_id", "epoch", name="uq_checkpoints_run_id_epoch"),
    )
    op.create_index("ix_checkpoints_run_id", "checkpoints", ["run_id"])
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), primary_key=True),
        _run_fk("events"),
        _at("at"),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("worker_id", sa.Integer(), nullable=True),
    )
    op.create_index("ix_events_run_id_id", "events", ["run_id", "id"])


def downgrade() -> None:
    for table in ("events", "checkpoints", "progress_samples", "workers", "runs"):
        op.drop_table(table)
