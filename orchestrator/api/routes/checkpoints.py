"""Checkpoints: upload by a worker, list, download (streamed), and delete (admin).

Before any byte of an upload is read, the worker must be the run's checkpointer, the epoch no more than
``checkpoint_every_epochs`` past the swarm's (``checkpoints.check_upload``), the worker not uploading
another checkpoint, and the temp dir's disk must have room for it plus ``checkpoint_min_free_bytes``.
The upload is then received as :mod:`orchestrator.api.uploads` does (size capped, SHA-256 computed);
only bytes that match ``X-Checksum-Sha256`` and look like a checkpoint
(:mod:`orchestrator.api.checkpoint_format`) reach the CheckpointStore. The run
keeps its newest ``keep_checkpoints``; older ones are deleted from the store after the new one is
recorded.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request, status
from fastapi import Path as PathParam
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from orchestrator.api import uploads
from orchestrator.api.checkpoint_format import check_checkpoint_file
from orchestrator.api.deps import (
    MAX_ID,
    Admin,
    AdminTokenHash,
    ClockDep,
    DatabaseDep,
    HubDep,
    Reader,
    ReadSession,
    SettingsDep,
    StoreDep,
    SwarmDep,
    SwarmReader,
    Token,
    UploadsDep,
    WorkerId,
    check_run_access,
)
from orchestrator.api.routes.workers import CallingWorker
from orchestrator.clock import Clock
from orchestrator.config import Settings
from orchestrator.db.models import Run
from orchestrator.db.session import Database
from orchestrator.domain import checkpoints, runs
from orchestrator.domain.states import ACTIVE_RUN_STATES, ENDED_WORKER_STATES
from orchestrator.errors import Conflict, InvalidRequest
from orchestrator.heartbeats.hub import HeartbeatHub, WorkerEntry
from orchestrator.schemas import CheckpointList
from orchestrator.storage.base import CheckpointNotFound, CheckpointStore, checkpoint_key
from orchestrator.swarm.dht import SwarmProgressCache
from worker.protocol.paths import CHECKSUM_HEADER, ApiPath
from worker.protocol.workers import CheckpointRef

logger = logging.getLogger(__name__)
router = APIRouter(tags=["checkpoints"])

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
Epoch = Annotated[int, PathParam(ge=0, le=10**12)]


@dataclass(frozen=True)
class Uploading:
    """The parts an upload uses, from the admission check to the record and the pruning."""

    settings: Settings
    db: Database
    clock: Clock
    hub: HeartbeatHub
    store: CheckpointStore
    swarm: SwarmProgressCache
    read_swarm_now: Callable[[int], None]


async def uploading(
    settings: SettingsDep,
    db: DatabaseDep,
    clock: ClockDep,
    hub: HubDep,
    store: StoreDep,
    swarm: SwarmDep,
    read_swarm_now: SwarmReader,
) -> Uploading:
    return Uploading(settings, db, clock, hub, store, swarm, read_swarm_now)


@router.put(
    ApiPath.checkpoint_upload,
    status_code=status.HTTP_201_CREATED,
    summary="Upload a checkpoint (worker token)",
    openapi_extra={"requestBody": {"content": {"application/octet-stream": {"schema": {"type": "string"}}}}},
)
async def upload_checkpoint(
    worker_id: WorkerId,
    entry: CallingWorker,
    epoch: Epoch,
    request: Request,
    parts: Annotated[Uploading, Depends(uploading)],
    slots: UploadsDep,
    checksum: Annotated[str | None, Header(alias=CHECKSUM_HEADER)] = None,
) -> CheckpointRef:
    """Raw body = the checkpoint bytes (``torch.save`` output). 400 on a checksum mismatch, 422 for bytes
    that are no torch-saved Lightning checkpoint, 413 over ``checkpoint_max_bytes``,
    409 unless this worker is the run's checkpointer, for an epoch more than ``checkpoint_every_epochs``
    ahead of the swarm, while this worker uploads another checkpoint, or when the epoch is stored with
    other bytes (the same bytes again: the stored one is returned); 507 when the disk is nearly full."""
    if entry.state in ENDED_WORKER_STATES:
        raise Conflict(f"worker {worker_id} has ended ({entry.state}); it cannot upload")
    sha256 = (checksum or "").strip().lower()
    if not SHA256_RE.match(sha256):
        raise InvalidRequest(f"header {CHECKSUM_HEADER} must be the hex SHA-256 of the body")
    with slots.hold(worker_id):
        size = uploads.declared_size(request, parts.settings.checkpoint_max_bytes)
        await run_in_threadpool(_admit, parts, entry, epoch, size)
        return await _receive_and_store(parts, entry, epoch, request, sha256)


def _admit(parts: Uploading, entry: WorkerEntry, epoch: int, size_bytes: int) -> None:
    """Raise unless the worker may upload ``size_bytes`` for ``epoch`` now (see the module docstring)."""
    run = _run_of(parts.db, entry)
    try:
        checkpoints.check_upload(run, entry.worker_id, epoch, _dht_epoch(parts.swarm, run))
    except Conflict:
        if run.checkpointer_worker_id != entry.worker_id:
            raise
        # The checkpointer's own DHT peer may hold an epoch the periodic reader has not seen yet.
        parts.read_swarm_now(run.id)
        checkpoints.check_upload(run, entry.worker_id, epoch, _dht_epoch(parts.swarm, run))
    uploads.check_free_space(parts.settings, size_bytes)


def _run_of(db: Database, entry: WorkerEntry) -> Run:
    with db.read() as session:
        run = session.get(Run, entry.run_id)
    if run is None:
        raise Conflict(f"worker {entry.worker_id}'s run no longer exists")
    return run


def _dht_epoch(swarm: SwarmProgressCache, run: Run) -> int | None:
    progress = swarm.get(run.swarm_id)
    return progress.epoch if progress is not None else None


async def _receive_and_store(
    parts: Uploading, entry: WorkerEntry, epoch: int, request: Request, sha256: str
) -> CheckpointRef:
    max_bytes = parts.settings.checkpoint_max_bytes
    async with uploads.received(request, parts.settings, max_bytes, sha256, "checkpoint") as upload:
        await run_in_threadpool(check_checkpoint_file, upload.path)
        return await run_in_threadpool(
            _store_and_record, parts, entry, epoch, upload.path, sha256, upload.size
        )


def _store_and_record(
    parts: Uploading, entry: WorkerEntry, epoch: int, path: Path, sha256: str, size: int
) -> CheckpointRef:
    with parts.db.read() as session:
        run = session.get(Run, entry.run_id)
        if run is None:
            raise Conflict(f"worker {entry.worker_id}'s run no longer exists")
        previous = checkpoints.existing_upload(session, run, epoch, sha256)
        if previous is not None:
            return checkpoints.to_ref(run, previous)
        if run.state not in ACTIVE_RUN_STATES:
            raise Conflict(f"run {run.name!r} is {run.state}; it takes no checkpoints")
        key = checkpoint_key(run.swarm_id, epoch, sha256)
    parts.store.put_file(key, path, sha256)
    try:
        ref, dropped = _record(parts, entry, run.name, epoch, key, sha256, size)
    except Conflict:
        parts.store.delete(key)  # another upload of this epoch, with other bytes, was recorded first
        raise
    for old_key in dropped:  # its own key too when an older epoch arrived late and was pruned at once
        parts.store.delete(old_key)
    parts.hub.refresh()
    return ref


def _record(
    parts: Uploading, entry: WorkerEntry, name: str, epoch: int, key: str, sha256: str, size: int
) -> tuple[CheckpointRef, list[str]]:
    """Record the stored object; the ref and the keys of pruned checkpoints. Raises Conflict."""
    with parts.db.begin() as session:
        run = runs.get_run(session, name, for_update=True)
        if (previous := checkpoints.existing_upload(session, run, epoch, sha256)) is not None:
            return checkpoints.to_ref(run, previous), []  # a concurrent retry of the same upload won
        stored, dropped = checkpoints.record_checkpoint(
            session,
            run,
            epoch=epoch,
            key=key,
            size_bytes=size,
            sha256=sha256,
            worker_id=entry.worker_id,
            now=parts.clock(),
        )
        return checkpoints.to_ref(run, stored), dropped


@router.get(ApiPath.run_checkpoints, summary="A run's checkpoints, newest first")
def list_checkpoints(name: str, session: ReadSession, _: Reader) -> CheckpointList:
    run = runs.get_run(session, name)
    return CheckpointList(
        items=[checkpoints.to_ref(run, c) for c in checkpoints.list_checkpoints(session, run.id)]
    )


# The bytes of a checkpoint, not JSON (documented so, for clients and the schema-driven fuzz tests).
CHECKPOINT_BYTES: dict[int | str, dict[str, object]] = {
    200: {
        "description": "The checkpoint's bytes; their SHA-256 is in X-Checksum-Sha256.",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


@router.get(
    ApiPath.run_latest_checkpoint,
    summary="Download the newest checkpoint",
    response_class=StreamingResponse,
    responses=CHECKPOINT_BYTES,
)
def download_latest(
    name: str, db: DatabaseDep, store: StoreDep, admin_token_hash: AdminTokenHash, token: Token
) -> StreamingResponse:
    """Needs the admin token, the run's join token or a worker token of the run. Streamed; the
    checksum is in ``X-Checksum-Sha256``."""
    return _download(db, store, admin_token_hash, name, None, token)


@router.get(
    ApiPath.run_checkpoint,
    summary="Download a checkpoint",
    response_class=StreamingResponse,
    responses=CHECKPOINT_BYTES,
)
def download(
    name: str, epoch: Epoch, db: DatabaseDep, store: StoreDep, admin_token_hash: AdminTokenHash, token: Token
) -> StreamingResponse:
    """Same access rule as ``latest/download``."""
    return _download(db, store, admin_token_hash, name, epoch, token)


def _download(
    db: Database,
    store: CheckpointStore,
    admin_token_hash: str,
    name: str,
    epoch: int | None,
    token: str | None,
) -> StreamingResponse:
    with db.read() as session:
        run = runs.get_run(session, name)
        check_run_access(admin_token_hash, session, run, token)
        checkpoint = checkpoints.get_checkpoint(session, run, epoch)
    stream = store.open_stream(checkpoint.key)
    headers = {
        CHECKSUM_HEADER: checkpoint.sha256,
        "Content-Length": str(checkpoint.size_bytes),
        "Content-Disposition": f'attachment; filename="{run.name}-epoch-{checkpoint.epoch}.ckpt"',
    }
    return StreamingResponse(stream, media_type="application/octet-stream", headers=headers)


@router.delete(ApiPath.run_checkpoint_item, summary="Delete a checkpoint (admin)")
def delete_checkpoint(
    name: str, epoch: Epoch, db: DatabaseDep, hub: HubDep, store: StoreDep, clock: ClockDep, _: Admin
) -> CheckpointList:
    """Delete the run's checkpoint of ``epoch`` (one that does not load, or that you no longer trust):
    workers that register later resume from the newest one left. The deleted checkpoints in ``items``;
    404 when there is none."""
    return _delete(db, hub, store, name, clock, epoch=epoch)


@router.delete(ApiPath.run_checkpoints, summary="Delete every checkpoint one worker uploaded (admin)")
def delete_uploads_of(
    name: str,
    uploaded_by: Annotated[int, Query(ge=0, le=MAX_ID, description="The worker whose uploads to delete.")],
    db: DatabaseDep,
    hub: HubDep,
    store: StoreDep,
    clock: ClockDep,
    _: Admin,
) -> CheckpointList:
    """Delete every checkpoint of the run the worker ``uploaded_by`` uploaded (a worker you no longer
    trust); 404 when it uploaded none that is still kept."""
    return _delete(db, hub, store, name, clock, uploaded_by=uploaded_by)


def _delete(
    db: Database,
    hub: HeartbeatHub,
    store: CheckpointStore,
    name: str,
    clock: Clock,
    *,
    epoch: int | None = None,
    uploaded_by: int | None = None,
) -> CheckpointList:
    with db.begin() as session:
        run = runs.get_run(session, name, for_update=True)
        deleted = checkpoints.delete_checkpoints(session, run, clock(), epoch=epoch, uploaded_by=uploaded_by)
        items = [checkpoints.to_ref(run, c) for c in deleted]
    for checkpoint in deleted:
        try:
            store.delete(checkpoint.key)
        except (OSError, CheckpointNotFound) as exc:
            logger.warning("run %s: could not delete checkpoint %s: %s", name, checkpoint.key, exc)
    hub.refresh()  # the heartbeat replies' latest checkpoint epoch
    return CheckpointList(items=items)
