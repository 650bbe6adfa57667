"""Checkpoint records: what the store holds for each run, newest epoch first, the last K kept; and who
may upload one.

The API checks :func:`check_upload` and takes the worker's :class:`UploadSlots` slot, streams the
upload to a temporary file, verifies it, puts it in the CheckpointStore and then calls
:func:`record_checkpoint`; the keys it returns are deleted from the store after the commit (a crash in
between leaves an orphan file, never a row without its file).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from orchestrator.db.models import Checkpoint, Event, Run
from orchestrator.domain import events, runs
from orchestrator.domain.states import ACTIVE_RUN_STATES
from orchestrator.errors import Conflict, InvalidRequest, NotFound
from orchestrator.sizes import fmt_bytes
from worker.protocol.paths import API_PREFIX, ApiPath
from worker.protocol.workers import CheckpointRef


def to_ref(run: Run, checkpoint: Checkpoint) -> CheckpointRef:
    """The wire view of a checkpoint, with the API path to download it from."""
    return CheckpointRef(
        epoch=checkpoint.epoch,
        size_bytes=checkpoint.size_bytes,
        sha256=checkpoint.sha256,
        created_at=checkpoint.created_at.isoformat(),
        download_path=API_PREFIX + ApiPath.run_checkpoint.format(name=run.name, epoch=checkpoint.epoch),
    )


def list_checkpoints(session: Session, run_id: int) -> Sequence[Checkpoint]:
    query = select(Checkpoint).where(Checkpoint.run_id == run_id).order_by(Checkpoint.epoch.desc())
    return session.scalars(query).all()


def get_checkpoint(session: Session, run: Run, epoch: int | None) -> Checkpoint:
    """The run's checkpoint at ``epoch`` (the latest when None); raises :class:`NotFound`."""
    query = select(Checkpoint).where(Checkpoint.run_id == run.id)
    if epoch is None:
        query = query.order_by(Checkpoint.epoch.desc()).limit(1)
    else:
        query = query.where(Checkpoint.epoch == epoch)
    checkpoint = session.scalar(query)
    if checkpoint is None:
        what = "no checkpoint" if epoch is None else f"no checkpoint at epoch {epoch}"
        raise NotFound(f"run {run.name!r} has {what}")
    return checkpoint


def check_upload(run: Run, worker_id: int, epoch: int, dht_epoch: int | None = None) -> None:
    """Raise :class:`Conflict` unless ``worker_id`` may upload ``run``'s checkpoint of ``epoch`` now.

    Only the run's checkpointer uploads (in a stopping run, the one it had when the stop began, for its
    final checkpoint), and only epochs up to ``checkpoint_every_epochs`` past the swarm's epoch as the
    orchestrator knows it (:func:`orchestrator.domain.runs.swarm_progress`; ``dht_epoch`` just read): any
    other worker, or made-up epochs far ahead, would prune the run's real checkpoints and make the heartbeat
    replies' ``latest_checkpoint_epoch`` keep the real checkpointer from uploading again.
    """
    if run.state not in ACTIVE_RUN_STATES:
        raise Conflict(f"run {run.name!r} is {run.state}; it takes no checkpoints")
    if run.checkpointer_worker_id != worker_id:
        raise Conflict(f"worker {worker_id} is not the run's checkpointer: only the checkpointer uploads")
    swarm_epoch = runs.swarm_epoch(run, dht_epoch)
    if epoch > swarm_epoch + run.checkpoint_every_epochs:
        raise Conflict(
            f"epoch {epoch} is ahead of the swarm (epoch {swarm_epoch} as read from the DHT, checkpoints "
            f"every {run.checkpoint_every_epochs} epochs)"
        )


class UploadSlots:
    """Which workers are uploading right now (this process): one upload per worker at a time, so that a
    worker cannot stream many checkpoints at once into the orchestrator's disk."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy: set[int] = set()

    @contextmanager
    def hold(self, worker_id: int) -> Iterator[None]:
        """Hold the worker's slot while uploading; :class:`Conflict` when it is taken."""
        with self._lock:
            if worker_id in self._busy:
                raise Conflict(f"worker {worker_id} is already uploading a checkpoint: one at a time")
            self._busy.add(worker_id)
        try:
            yield
        finally:
            with self._lock:
                self._busy.discard(worker_id)


def existing_upload(session: Session, run: Run, epoch: int, sha256: str) -> Checkpoint | None:
    """The stored checkpoint of ``epoch`` if it has this checksum (a retried upload), else None.

    Raises :class:`Conflict` when that epoch was stored with different bytes.
    """
    checkpoint = session.scalar(
        select(Checkpoint).where(Checkpoint.run_id == run.id, Checkpoint.epoch == epoch)
    )
    if checkpoint is None:
        return None
    if checkpoint.sha256 != sha256:
        raise Conflict(f"run {run.name!r} already has a different checkpoint at epoch {epoch}")
    return checkpoint


def record_checkpoint(
    session: Session,
    run: Run,
    *,
    epoch: int,
    key: str,
    size_bytes: int,
    sha256: str,
    worker_id: int | None,
    now: datetime,
) -> tuple[Checkpoint, list[str]]:
    """Record a stored checkpoint and drop all but the run's newest ``keep_checkpoints``.

    Returns the new row and the store keys of the dropped ones (delete them after the commit).
    """
    checkpoint = Checkpoint(
        run_id=run.id,
        epoch=epoch,
        key=key,
        size_bytes=size_bytes,
        sha256=sha256,
        created_at=now,
        uploaded_by=worker_id,
    )
    session.add(checkpoint)
    session.flush()
    events.record_event(
        session, run.id, "checkpoint.stored", f"epoch {epoch}, {fmt_bytes(size_bytes)}", now, worker_id
    )
    old = list_checkpoints(session, run.id)[run.keep_checkpoints :]
    if old:
        session.execute(delete(Checkpoint).where(Checkpoint.id.in_([c.id for c in old])))
        epochs = ", ".join(str(c.epoch) for c in old)
        events.record_event(session, run.id, "checkpoint.pruned", f"epochs {epochs}", now)
    return checkpoint, [c.key for c in old]


UNLOADABLE = "checkpoint.unloadable"  # the event kind of a checkpoint a worker could not resume from


def record_resume_failure(
    session: Session, run_id: int, worker_id: int, epoch: int, message: str, now: datetime
) -> None:
    """Record that ``worker_id`` could not resume from its run's checkpoint of ``epoch`` (it fell back to
    an older one or none), naming the worker that uploaded it: the admin's lead to delete it. Once per
    worker and checkpoint (a worker repeating itself adds nothing). Raises :class:`NotFound` when the run
    is gone or has no checkpoint of ``epoch``."""
    run = session.get(Run, run_id)
    if run is None:
        raise NotFound(f"worker {worker_id}'s run no longer exists")
    checkpoint = get_checkpoint(session, run, epoch)
    said = f"worker {worker_id} could not resume from the checkpoint of epoch {epoch}"
    already = select(Event.id).where(
        Event.run_id == run.id,
        Event.kind == UNLOADABLE,
        Event.message.startswith(said + ",", autoescape=True),
    )
    if session.scalar(already.limit(1)) is not None:
        return
    by = checkpoint.uploaded_by
    uploader = f"worker {by}" if by is not None else "a worker unknown"
    events.record_event(
        session, run.id, UNLOADABLE, f"{said}, uploaded by {uploader}: {message}", now, worker_id
    )


def delete_checkpoints(
    session: Session, run: Run, now: datetime, *, epoch: int | None = None, uploaded_by: int | None = None
) -> list[Checkpoint]:
    """Delete ``run``'s checkpoint of ``epoch``, or every one ``uploaded_by`` uploaded (an admin's answer to
    a checkpoint that does not load, or to a worker it no longer trusts); returns the deleted rows (delete
    their store keys after the commit). Workers that register later resume from the newest one left.

    Raises :class:`InvalidRequest` unless exactly one of the two is given, :class:`NotFound` when nothing
    matches.
    """
    if (epoch is None) == (uploaded_by is None):
        raise InvalidRequest("name either an epoch or the worker whose uploads to delete (uploaded_by)")
    query = select(Checkpoint).where(Checkpoint.run_id == run.id)
    if epoch is not None:
        query = query.where(Checkpoint.epoch == epoch)
    else:
        query = query.where(Checkpoint.uploaded_by == uploaded_by)
    doomed = list(session.scalars(query.order_by(Checkpoint.epoch.desc())))
    if not doomed:
        what = f"at epoch {epoch}" if epoch is not None else f"uploaded by worker {uploaded_by}"
        raise NotFound(f"run {run.name!r} has no checkpoint {what}")
    session.execute(delete(Checkpoint).where(Checkpoint.id.in_([c.id for c in doomed])))
    epochs = ", ".join(str(c.epoch) for c in doomed)
    by = f" (uploaded by worker {uploaded_by})" if uploaded_by is not None else ""
    events.record_event(
        session, run.id, "checkpoint.deleted", f"epochs {epochs}{by} deleted by the admin", now
    )
    return doomed
