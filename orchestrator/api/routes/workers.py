"""``/api/v1/workers``: register (join or launch token), heartbeat and deregister (worker token).

The heartbeat is the hot path: it is answered from memory by the HeartbeatHub and written to the
database in batches; only a worker missing from the cache costs a database read.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from orchestrator.api.deps import (
    CrashPolicyDep,
    HeartbeatSettler,
    HubDep,
    OwnPeers,
    RegisteringDep,
    RegistrationToken,
    UseCasesDep,
    WorkerId,
    WorkerToken,
)
from orchestrator.errors import NotFound, Unauthorized
from orchestrator.heartbeats.hub import HeartbeatHub, WorkerEntry
from worker.protocol.paths import ApiPath
from worker.protocol.validators import MAX_ID
from worker.protocol.workers import (
    Deregister,
    Heartbeat,
    HeartbeatReply,
    ResumeFailure,
    WorkerRegister,
    WorkerRegistered,
)

router = APIRouter(tags=["workers"])


@router.post(
    ApiPath.register, summary="Join a run (join, launch or worker token)", response_model=WorkerRegistered
)
async def register(
    body: WorkerRegister, registering: RegisteringDep, own: OwnPeers, token: RegistrationToken
) -> JSONResponse:
    """A launch token binds its own launch row (and gets a fresh worker token), a worker token its own
    row again; a join token always creates a new manual worker. 401 for an unknown token, 409 when the
    run is stopping or finished, when it has ``max_workers`` live workers (join token) or when
    ``request_id`` is taken (join token), 429 past the join token's rate (``Retry-After``)."""
    registered = await registering.register(token, body, own)
    answered = registered.reply.model_dump(mode="json", exclude={"run"})
    return JSONResponse(
        {name: registered.run_json if name == "run" else answered[name] for name in REPLY_FIELDS}
    )


REPLY_FIELDS = tuple(WorkerRegistered.model_fields)  # the order of a registration reply's keys


async def authenticated_worker(hub: HeartbeatHub, worker_id: int, token: str | None) -> WorkerEntry:
    """The cached entry of ``worker_id`` if ``token`` is its token; 401/403/404 otherwise."""
    if token is None:
        raise Unauthorized("missing bearer token (the worker token)")
    if not 0 <= worker_id <= MAX_ID:  # no such row; the database would fail on the number itself
        raise NotFound(f"worker {worker_id} not found")
    entry = hub.cached(worker_id) or await run_in_threadpool(hub.load, worker_id)
    if entry is None:
        raise NotFound(f"worker {worker_id} not found")
    hub.authenticate(entry, token)
    return entry


async def calling_worker(worker_id: WorkerId, hub: HubDep, token: WorkerToken) -> WorkerEntry:
    """The route's worker, authenticated by its own token; a dependency, so it runs before the body
    is validated (no token: 401 whatever the body)."""
    return await authenticated_worker(hub, worker_id, token)


CallingWorker = Annotated[WorkerEntry, Depends(calling_worker)]


@router.post(ApiPath.heartbeat, summary="Report progress (worker token)")
async def heartbeat(
    worker_id: WorkerId,  # noqa: ARG001 - the path parameter; calling_worker reads it
    entry: CallingWorker,
    body: Heartbeat,
    hub: HubDep,
) -> HeartbeatReply:
    """The reply says continue or stop, whether this worker is the run's checkpointer and the
    checkpoint policy. A worker that has ended, is retiring or whose run is stopping gets ``stop``."""
    return hub.accept(entry, body)


@router.post(
    ApiPath.deregister, status_code=status.HTTP_204_NO_CONTENT, summary="Leave the run (worker token)"
)
async def deregister(
    worker_id: WorkerId,
    _: CallingWorker,
    body: Deregister,
    cases: UseCasesDep,
    settle: HeartbeatSettler,
    crash_policy: CrashPolicyDep,
) -> Response:
    """interrupted -> interrupted, stopped/completed -> exited, error -> failed (with an event)."""
    await run_in_threadpool(cases.worker_leaves, worker_id, body, crash_policy, settle)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post(
    ApiPath.resume_failure,
    status_code=status.HTTP_204_NO_CONTENT,
    summary="Report a checkpoint that did not load (worker token)",
)
def resume_failure(
    worker_id: WorkerId, entry: CallingWorker, body: ResumeFailure, cases: UseCasesDep
) -> Response:
    """Records a ``checkpoint.unloadable`` event naming the checkpoint and who uploaded it: the worker
    falls back to an older checkpoint (or none) and trains on, so nothing else changes; the admin may
    delete the checkpoint (``DELETE /runs/{name}/checkpoints/{epoch}``)."""
    cases.checkpoint_unloadable(entry.run_id, worker_id, body.epoch, body.message)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
