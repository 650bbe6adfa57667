"""The orchestrator's tables (SQLAlchemy 2.x typed mappings). The schema itself lives in ``migrations/``.

Runs own everything else: deleting a run deletes its workers, events, progress samples and checkpoint
rows (``ON DELETE CASCADE``). States are enums (``worker.protocol``'s ``RunState`` and ``WorkerState``,
``StopCause``; their sets are in ``orchestrator/domain/states.py``), stored as their short string
values (:func:`state_type`); ``orchestrator/domain/runs.py`` is the only code that changes them. Tokens
are stored as SHA-256 hex digests, never in clear. Times are timezone-aware UTC (see :class:`UTCDateTime`).
"""

from __future__ import annotations

from collections.abc import Container
from datetime import UTC, datetime
from enum import Enum
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    true,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import Enum as EnumType
from sqlalchemy.types import TypeDecorator

from worker.protocol.runs import RunState, StopCause
from worker.protocol.workers import WorkerState

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored as UTC and always read back timezone-aware (SQLite forgets the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given; pass a timezone-aware UTC time")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def state_type(enum: type[Enum]) -> EnumType:
    """A column of ``enum`` members stored as their values in a VARCHAR(16), with no CHECK constraint
    and no native enum type: the same column contents as plain strings, and a new state needs no
    migration. Binding a string that is no member's value raises."""
    return EnumType(
        enum,
        native_enum=False,
        create_constraint=False,
        length=16,
        validate_strings=True,
        values_callable=lambda members: [str(m.value) for m in members],
    )


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UTCDateTime(),
        dict[str, Any]: JSON(),
        list[str]: JSON(),
    }

    @classmethod
    def column_names(cls) -> frozenset[str]:
        return frozenset(column.key for column in cls.__table__.columns)

    def column_values(self, names: Container[str]) -> dict[str, Any]:
        """This row's values of its columns named in ``names`` (e.g. a pydantic model's fields): for
        models that show columns as they are stored."""
        return {key: getattr(self, key) for key in self.column_names() if key in names}


class Run(Base):
    """One training run: its spec (from ``RunSpec``), lifecycle state and the DHT prefix of its swarm."""

    __tablename__ = "runs"
    # SQLite: never hand out a deleted run's id again (migration 0009)
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    swarm_id: Mapped[str] = mapped_column(String(80), unique=True)
    join_token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    # Spec (mutable parts: the worker counts, changed by scale).
    module: Mapped[str] = mapped_column(String(255))
    module_args: Mapped[dict[str, Any]]
    datamodule: Mapped[str] = mapped_column(String(255))
    datamodule_args: Mapped[dict[str, Any]]
    target_batch_size: Mapped[int] = mapped_column(BigInteger)
    batch_size: Mapped[int] = mapped_column(Integer)
    strategy_options: Mapped[dict[str, Any]]
    min_workers: Mapped[int] = mapped_column(Integer)
    max_workers: Mapped[int] = mapped_column(Integer)
    desired_workers: Mapped[int] = mapped_column(Integer)
    target_epochs: Mapped[int | None] = mapped_column(BigInteger)
    target_samples: Mapped[int | None] = mapped_column(BigInteger)
    checkpoint_every_epochs: Mapped[int] = mapped_column(Integer)
    keep_checkpoints: Mapped[int] = mapped_column(Integer)
    launcher: Mapped[str] = mapped_column(String(32))
    launcher_options: Mapped[dict[str, Any]]
    # The run's code package (SHA-256 of its bytes in the store), requirements and environment. Secret
    # values are kept here as given (the API never returns them): guard the database as the data dir.
    workdir: Mapped[str | None] = mapped_column(String(64), index=True)
    requirements: Mapped[list[str]] = mapped_column(JSON, default=list)
    env: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    secret_env: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    trainer: Mapped[dict[str, Any]] = mapped_column(default=dict)  # the spec's trainer section
    report_metrics: Mapped[list[str]] = mapped_column(default=list)
    max_worker_crashes: Mapped[int | None] = mapped_column(Integer)  # null: the server's default
    # What hand-joined workers (join token) are trusted with: the checkpointer role, the secret values.
    hand_joined_checkpoint: Mapped[bool] = mapped_column(Boolean, server_default=false())
    hand_joined_secrets: Mapped[bool] = mapped_column(Boolean, server_default=true())
    # Lifecycle.
    state: Mapped[RunState] = mapped_column(state_type(RunState), index=True)
    state_reason: Mapped[str] = mapped_column(Text, default="")  # for people: rules read stop_cause
    # Why the run was asked to stop or failed (null while it has not been): decides completed vs stopped.
    stop_cause: Mapped[StopCause | None] = mapped_column(state_type(StopCause))
    checkpointer_worker_id: Mapped[int | None] = mapped_column(Integer)  # no FK: avoids a cycle
    # The highest swarm epoch the orchestrator's DHT reader saw: what the stop condition and the epochs
    # of checkpoint uploads are judged by (workers' own reports never count for either).
    swarm_epoch: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    stop_requested_at: Mapped[datetime | None]
    # What the run's workers reported last, kept when it finishes; final_metrics also keeps each leaving
    # worker's last metrics, shown for those no live worker reports (orchestrator/domain/reported.py).
    final_loss: Mapped[float | None] = mapped_column(Float)
    averaging: Mapped[dict[str, Any] | None]  # the recent window of outcomes and its warning (averaging.py)
    final_metrics: Mapped[dict[str, Any] | None]
    consecutive_start_failures: Mapped[int] = mapped_column(Integer, default=0)
    last_start_failure_at: Mapped[datetime | None]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]

    workers: Mapped[list[Worker]] = relationship(
        back_populates="run", cascade="all, delete-orphan", passive_deletes=True
    )


class Worker(Base):
    """One worker: a launch intent (state ``launching``) or a registered agent, and its latest report."""

    __tablename__ = "workers"
    # SQLite: never hand out a deleted worker's id again (migration 0009)
    __table_args__ = (Index("ix_workers_run_id_state", "run_id", "state"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    request_id: Mapped[str] = mapped_column(String(64), unique=True)
    launcher: Mapped[str] = mapped_column(String(32))
    launcher_handle: Mapped[str | None] = mapped_column(String(128))
    manual: Mapped[bool] = mapped_column(Boolean, default=False)
    state: Mapped[WorkerState] = mapped_column(state_type(WorkerState))
    state_reason: Mapped[str] = mapped_column(Text, default="")
    retire_requested_at: Mapped[datetime | None]  # asked to leave (scale-down): heartbeats answer stop
    token_hash: Mapped[str | None] = mapped_column(String(64), unique=True)  # the worker token
    # A launched worker's one-time registration token; void once the worker has used its worker token.
    launch_token_hash: Mapped[str | None] = mapped_column(String(64), unique=True)
    peer_id: Mapped[str | None] = mapped_column(String(128))  # its swarm token's libp2p peer id
    hostname: Mapped[str] = mapped_column(String(255), default="")
    peer_maddrs: Mapped[list[str]]
    launch_details: Mapped[dict[str, Any]]
    exit_reason: Mapped[str | None] = mapped_column(Text)
    # Its slot among the run's live workers, for sharding (worker/context.py): set at registration.
    worker_index: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime]
    registered_at: Mapped[datetime | None]
    last_heartbeat_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]
    # Latest heartbeat numbers.
    local_step: Mapped[int] = mapped_column(BigInteger, default=0)
    swarm_epoch: Mapped[int] = mapped_column(BigInteger, default=0)
    samples: Mapped[int] = mapped_column(BigInteger, default=0)
    loss: Mapped[float | None] = mapped_column(Float)
    samples_per_s: Mapped[float] = mapped_column(Float, default=0.0)
    num_peers: Mapped[int] = mapped_column(Integer, default=0)
    phase: Mapped[str] = mapped_column(String(16), default="starting")
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)  # the run's report_metrics: name -> value
    averaging: Mapped[dict[str, Any] | None]  # outcome counts of its latest heartbeat (wire.AveragingCounts)

    run: Mapped[Run] = relationship(back_populates="workers")


class ProgressSample(Base):
    """A run's aggregated progress at one moment: what workers reported and what the DHT showed."""

    __tablename__ = "progress_samples"
    __table_args__ = (Index("ix_progress_samples_run_id_at", "run_id", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    at: Mapped[datetime]
    swarm_epoch: Mapped[int] = mapped_column(BigInteger)
    samples_total: Mapped[int] = mapped_column(BigInteger)
    loss: Mapped[float | None] = mapped_column(Float)
    samples_per_s: Mapped[float] = mapped_column(Float)
    live_workers: Mapped[int] = mapped_column(Integer)
    dht_epoch: Mapped[int | None] = mapped_column(BigInteger)
    dht_samples: Mapped[int | None] = mapped_column(BigInteger)
    dht_peers: Mapped[int | None] = mapped_column(Integer)
    metrics: Mapped[dict[str, Any] | None]  # mean over workers with a fresh heartbeat, by name
    averaging: Mapped[dict[str, Any] | None]  # the run's outcome counts summed over its workers


class Checkpoint(Base):
    """A stored checkpoint; ``key`` addresses it in the CheckpointStore."""

    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("run_id", "epoch", name="uq_checkpoints_run_id_epoch"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    epoch: Mapped[int] = mapped_column(BigInteger)
    key: Mapped[str] = mapped_column(String(255))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime]
    uploaded_by: Mapped[int | None] = mapped_column(Integer)  # worker id; no FK, workers may be gone


class Event(Base):
    """Something that happened to a run, newest last; ``id`` is the pagination cursor."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_run_id_id", "run_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    at: Mapped[datetime]
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)
    worker_id: Mapped[int | None] = mapped_column(Integer)


class DeploymentFact(Base):
    """A fact every orchestrator on this database must agree on (e.g. the swarm authority's public key)."""

    __tablename__ = "deployment_facts"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    recorded_at: Mapped[datetime]
