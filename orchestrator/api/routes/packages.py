"""Runs' code packages (``runs create --workdir``): upload and look up with the admin token; the run's
workers download theirs.

A package is stored once in the CheckpointStore under ``packages/<sha256>.tar.gz`` (content-addressed:
runs that name the same bytes share it; it is deleted with the last run that names it). An upload is
checked before it is stored: its SHA-256 must be the one in the path, its size within
``package_max_bytes`` (the body-limit middleware refuses more before reading), and the archive one that
workers can extract (:func:`worker.runtime.package.inspect_archive`: relative paths, no link leaving it,
at most ``package_max_bytes`` unpacked).
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Request, Response, status
from fastapi import Path as PathParam
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from orchestrator.api import uploads
from orchestrator.api.deps import (
    Admin,
    AdminTokenHash,
    DatabaseDep,
    SettingsDep,
    StoreDep,
    Token,
    check_run_access,
)
from orchestrator.api.routes.checkpoints import SHA256_RE
from orchestrator.domain import runs
from orchestrator.errors import InvalidRequest, NotFound
from orchestrator.schemas import PackageRef
from orchestrator.storage.base import CheckpointNotFound, CheckpointStore, package_key
from worker.protocol.paths import CHECKSUM_HEADER, ApiPath
from worker.protocol.validators import SHA256_PATTERN
from worker.runtime.package import UnsafePackage, inspect_archive

logger = logging.getLogger(__name__)
router = APIRouter(tags=["packages"])

Sha256 = Annotated[str, PathParam(pattern=SHA256_PATTERN, description="Hex SHA-256 of the package's bytes.")]
PACKAGE_BYTES: dict[int | str, dict[str, object]] = {
    200: {
        "description": "The package (a gzip-compressed tar); its SHA-256 is in X-Checksum-Sha256.",
        "content": {"application/gzip": {"schema": {"type": "string", "format": "binary"}}},
    }
}


def _stored(store: CheckpointStore, sha256: str) -> PackageRef | None:
    try:
        return PackageRef(sha256=sha256, size_bytes=store.size(package_key(sha256)))
    except CheckpointNotFound:
        return None


@router.get(ApiPath.package, summary="Look up a code package (admin)")
def get_package(sha256: Sha256, store: StoreDep, _: Admin) -> PackageRef:
    """404 when no package with this SHA-256 is stored (the CLI uploads it then)."""
    found = _stored(store, sha256)
    if found is None:
        raise NotFound(f"no package {sha256} is stored")
    return found


@router.put(
    ApiPath.package,
    summary="Upload a code package (admin)",
    responses={201: {"description": "Stored now"}},
    openapi_extra={"requestBody": {"content": {"application/octet-stream": {"schema": {"type": "string"}}}}},
)
async def put_package(
    sha256: Sha256, request: Request, response: Response, settings: SettingsDep, store: StoreDep, _: Admin
) -> PackageRef:
    """Raw body = the package. 201 when stored now, 200 when these bytes were stored already; 400 when the
    body's SHA-256 is not the path's, 413 over ``package_max_bytes``, 422 for an archive workers would
    refuse (its entry and why), 507 when the disk is nearly full."""
    limit = settings.package_max_bytes
    uploads.check_free_space(settings, uploads.declared_size(request, limit))
    async with uploads.received(request, settings, limit, sha256, "package") as upload:
        try:
            await run_in_threadpool(inspect_archive, upload.path, limit)
        except UnsafePackage as exc:
            raise InvalidRequest(f"package: {exc}") from exc
        existing = await run_in_threadpool(_stored, store, sha256)
        if existing is not None:
            return existing
        await run_in_threadpool(store.put_file, package_key(sha256), upload.path, sha256)
    logger.info("stored package %s (%d bytes)", sha256[:12], upload.size)
    response.status_code = status.HTTP_201_CREATED
    return PackageRef(sha256=sha256, size_bytes=upload.size)


@router.get(
    ApiPath.run_package,
    summary="Download a run's code package",
    response_class=StreamingResponse,
    responses=PACKAGE_BYTES,
)
def download_package(
    name: str, db: DatabaseDep, store: StoreDep, admin_token_hash: AdminTokenHash, token: Token
) -> StreamingResponse:
    """The bytes the run's spec names (``workdir``). Needs the admin token, the run's join token or a
    worker token of the run (as checkpoint downloads); 404 for a run without a package."""
    with db.read() as session:
        run = runs.get_run(session, name)
        check_run_access(admin_token_hash, session, run, token)
    if run.workdir is None or not SHA256_RE.match(run.workdir):
        raise NotFound(f"run {name!r} has no code package (it was created without --workdir)")
    key = package_key(run.workdir)
    try:
        size, stream = store.size(key), store.open_stream(key)
    except CheckpointNotFound as exc:
        raise NotFound(f"run {name!r}: its package {run.workdir} is missing from the store") from exc
    headers = {
        CHECKSUM_HEADER: run.workdir,
        "Content-Length": str(size),
        "Content-Disposition": f'attachment; filename="{name}-{run.workdir[:12]}.tar.gz"',
    }
    return StreamingResponse(stream, media_type="application/gzip", headers=headers)
