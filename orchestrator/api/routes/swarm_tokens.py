"""Swarm admission endpoints: a worker's swarm token, and the key every peer verifies tokens with.

``POST /workers/{worker_id}/swarm-token`` (worker token): a signed, short-lived token binding the
worker's peer key to its run (see ``docs/concepts/swarm-admission.md``). ``GET /swarm-auth`` (anyone): whether
this orchestrator admits peers by token, its public key, the token lifetime and the opted-out runs.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool

from orchestrator.api.deps import (
    AdminTokenHash,
    AdmissionDep,
    ClockDep,
    DatabaseDep,
    HubDep,
    SettingsDep,
    Token,
    WorkerId,
    is_admin,
)
from orchestrator.api.routes.workers import CallingWorker
from orchestrator.errors import Conflict
from orchestrator.swarm.admission import SwarmAdmission
from worker.protocol.paths import ApiPath
from worker.protocol.swarm_tokens import SwarmAuthInfo, SwarmToken, SwarmTokenRequest

router = APIRouter(tags=["swarm admission"])


def _admission(admission: SwarmAdmission | None) -> SwarmAdmission:
    if admission is None:
        raise Conflict("swarm admission is off on this orchestrator: peers join without tokens")
    return admission


@router.post(ApiPath.swarm_token, summary="A swarm token for this worker's peer (worker token)")
async def swarm_token(
    worker_id: WorkerId,
    _: CallingWorker,
    body: SwarmTokenRequest,
    admission: AdmissionDep,
    db: DatabaseDep,
    clock: ClockDep,
    hub: HubDep,
) -> SwarmToken:
    """401/403 for a wrong worker token, 409 when admission is off (here or for the run) or the worker
    has ended, 422 for a key that is not RSA of 2048 bits or more."""
    granting = _admission(admission)
    now = clock().timestamp()

    def grant() -> SwarmToken:
        with db.begin() as session:
            return granting.grant_for_worker(session, worker_id, body, now)

    granted = await run_in_threadpool(grant)
    hub.bind_peer(worker_id, granted.peer_id)
    return granted


@router.get(ApiPath.swarm_auth, summary="Swarm admission: on or off, and the key tokens are signed with")
def swarm_auth_info(
    admission: AdmissionDep, settings: SettingsDep, admin_token_hash: AdminTokenHash, token: Token
) -> SwarmAuthInfo:
    """Public (workers ask before they have a token; a public key is no secret). The opted-out runs
    are listed only when reads are public or the caller is the admin."""
    if admission is None:
        return SwarmAuthInfo(enabled=False)
    info = admission.info()
    if not settings.public_reads and not is_admin(admin_token_hash, token):
        info.open_swarms = []
    return info
