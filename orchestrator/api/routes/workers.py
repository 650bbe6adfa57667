"""``/api/v1/workers``: register (join or launch token), heartbeat and deregister (worker token).

The heartbeat is the hot path: it is answered from memory by the HeartbeatHub and written to the
database in batches; only a worker missing from the cache costs a database read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session

from orchestrator.api.deps import (
    AdmissionDep,
    ClockDep,
    CrashPolicyDep,
    DatabaseDep,
    HeartbeatSettler,
    HubDep,
    JoinLimiterDep,
    OwnPeers,
    RegistrationsDep,
    RegistrationToken,
    SettingsDep,
    UseCasesDep,
    WorkerId,
    WorkerToken,
)
from orchestrator.db.models import Checkpoint
from orchestrator.domain import checkpoints, runs, views, workers
from orchestrator.domain.roster import per_transaction, roster
from orchestrator.errors import NotFound, Unauthorized
from orchestrator.heartbeats.hub import HeartbeatHub, RunEntry, WorkerEntry
from worker.protocol.paths import ApiPath
from worker.protocol.runs import spec_for_workers, swarm_admission_requested
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
    body: WorkerRegister,
    db: DatabaseDep,
    clock: ClockDep,
    hub: HubDep,
    settings: SettingsDep,
    own: OwnPeers,
    join_limiter: JoinLimiterDep,
    admission: AdmissionDep,
    registrations: RegistrationsDep,
    token: RegistrationToken,
) -> JSONResponse:
    """A launch token binds its own launch row (and gets a fresh worker token), a worker token its own
    row again; a join token always creates a new manual worker. 401 for an unknown token, 409 when the
    run is stopping or finished, when it has ``max_workers`` live workers (join token) or when
    ``request_id`` is taken (join token), 429 past the join token's rate (``Retry-After``)."""

    def join(session: Session) -> tuple[workers.PendingRegistration, list[str], Sequence[Checkpoint]]:
        # may run twice (its batch again, in savepoints): it only reads and writes the session (and the
        # join token's limiter, charged again then)
        pending = workers.bind_worker(session, token, body, clock(), join_limiter)
        run_id = pending.registration.run.id
        # read once per transaction (the first join's own row is written first, by the read's autoflush)
        peers = per_transaction(session, ("peers", run_id), lambda: views.worker_peers(session, run_id))
        stored = per_transaction(  # newest first
            session, ("checkpoints", run_id), lambda: checkpoints.list_checkpoints(session, run_id)
        )
        return pending, peers, stored

    def answer(
        session: Session, joined: tuple[workers.PendingRegistration, list[str], Sequence[Checkpoint]]
    ) -> tuple[WorkerRegistered, dict[str, Any], tuple[WorkerEntry, RunEntry]]:
        # once the batch's new workers are written (this one's id is known)
        pending, peers, stored = joined
        reg = workers.record_registration(session, pending)
        run_id = reg.run.id
        spec = per_transaction(session, ("run-spec", run_id), lambda: runs.run_spec(reg.run))
        spec_json = per_transaction(session, ("run-spec-json", run_id), lambda: spec_for_workers(spec))
        reply = WorkerRegistered(
            worker_id=str(reg.worker.id),
            worker_token=reg.token,
            run=spec,
            swarm_id=reg.run.swarm_id,
            initial_peers=own + [m for m in peers if m not in own],
            heartbeat_interval_s=settings.heartbeat_interval_s,
            resume_checkpoint=checkpoints.to_ref(reg.run, stored[0]) if stored else None,
            older_checkpoints=[checkpoints.to_ref(reg.run, c) for c in stored[1:]],
            secret_env=runs.secret_values(reg.run, reg.worker),
            worker_index=reg.worker.worker_index or 0,
            num_workers=workers.shard_count(roster(session, run_id).running, reg.run.desired_workers),
        )
        return reply, spec_json, hub.entries_of(reg.worker)

    reply, spec_json, cached = await registrations.submit(join, answer)  # with those arriving meanwhile
    hub.note(cached)
    if admission is not None and not swarm_admission_requested(reply.run.strategy_options):
        # before the worker knocks on the DHT peer: one it refuses at first contact cannot join through it
        await run_in_threadpool(admission.serve_opted_out, db, reply.swarm_id)
    answered = reply.model_dump(mode="json", exclude={"run"})
    return JSONResponse({name: spec_json if name == "run" else answered[name] for name in REPLY_FIELDS})


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
