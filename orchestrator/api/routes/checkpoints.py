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
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request, status
from fastapi import Path as PathParam
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from orchestrator.api import uploads
from orchestrator.api.checkpoint_format import check_checkpoint_file
from orchestrator.api.deps import (
    Admin,
    AdminTokenHash,
    DatabaseDep,
    Reader,
    ReadSession,
    SettingsDep,
    StoreDep,
    SwarmReader,
    Token,
    UploadsDep,
    UseCasesDep,
    WorkerId,
    check_run_access,
)
from orchestrator.api.routes.workers import CallingWorker
from orchestrator.config import Settings
from orchestrator.db.session import Database
from orchestrator.domain import checkpoints, runs
from orchestrator.domain.states import ENDED_WORKER_STATES
from orchestrator.domain.usecases import UseCases
from orchestrator.errors import Conflict, InvalidRequest
from orchestrator.heartbeats.hub import WorkerEntry
from orchestrator.schemas import CheckpointList
from orchestrator.storage.base import CheckpointStore
from worker.protocol.paths import CHECKSUM_HEADER, ApiPath
from worker.protocol.validators import MAX_ID
from worker.protocol.workers import CheckpointRef

logger = logging.getLogger(__name__)
router = APIRouter(tags=["checkpoints"])

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
Epoch = Annotated[int, PathParam(ge=0, le=10**12)]


@dataclass(frozen=True)
class Uploading:
    """The parts an upload uses, from the admission check to the record and the pruning."""

    settings: Settings
    cases: UseCases
    read_swarm_now: Callable[[int], None]


async def uploading(settings: SettingsDep, cases: UseCasesDep, read_swarm_now: SwarmReader) -> Uploading:
    return Uploading(settings, cases, read_swarm_now)


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
    parts.cases.admit_checkpoint(entry.run_id, entry.worker_id, epoch, parts.read_swarm_now)
    uploads.check_free_space(parts.settings, size_bytes)


async def _receive_and_store(
    parts: Uploading, entry: WorkerEntry, epoch: int, request: Request, sha256: str
) -> CheckpointRef:
    max_bytes = parts.settings.checkpoint_max_bytes
    async with uploads.received(request, parts.settings, max_bytes, sha256, "checkpoint") as upload:
        await run_in_threadpool(check_checkpoint_file, upload.path)
        return await run_in_threadpool(
            parts.cases.upload_checkpoint,
            entry.run_id,
            entry.worker_id,
            epoch,
            upload.path,
            sha256,
            upload.size,
        )


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
def delete_checkpoint(name: str, epoch: Epoch, cases: UseCasesDep, _: Admin) -> CheckpointList:
    """Delete the run's checkpoint of ``epoch`` (one that does not load, or that you no longer trust):
    workers that register later resume from the newest one left. The deleted checkpoints in ``items``;
    404 when there is none."""
    return CheckpointList(items=cases.delete_checkpoints(name, epoch=epoch))


@router.delete(ApiPath.run_checkpoints, summary="Delete every checkpoint one worker uploaded (admin)")
def delete_uploads_of(
    name: str,
    uploaded_by: Annotated[int, Query(ge=0, le=MAX_ID, description="The worker whose uploads to delete.")],
    cases: UseCasesDep,
    _: Admin,
) -> CheckpointList:
    """Delete every checkpoint of the run the worker ``uploaded_by`` uploaded (a worker you no longer
    trust); 404 when it uploaded none that is still kept."""
    return CheckpointList(items=cases.delete_checkpoints(name, uploaded_by=uploaded_by))
