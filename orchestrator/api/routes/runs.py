"""``/api/v1/runs``: create, list, inspect, scale, stop, resume and delete runs; their events,
progress series and workers."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response, status

from orchestrator.api.deps import (
    Admin,
    ClockDep,
    DatabaseDep,
    ImportsDep,
    LaunchersDep,
    PackageClaimsDep,
    Reader,
    ReadSession,
    SettingsDep,
    SwarmDep,
    UseCasesDep,
)
from orchestrator.clock import Clock
from orchestrator.config import Settings
from orchestrator.db.session import Database
from orchestrator.domain import runs, views
from orchestrator.progress import SwarmProgressCache
from orchestrator.schemas import (
    EventPage,
    JoinToken,
    ProgressSeries,
    ResumeRequest,
    RevokedWorkers,
    RunCreated,
    RunList,
    RunOut,
    ScaleRequest,
    StopRequest,
    WorkerList,
)
from worker.protocol.paths import ApiPath
from worker.protocol.runs import RunSpec, RunState
from worker.protocol.validators import MAX_ID
from worker.protocol.workers import WorkerState

logger = logging.getLogger(__name__)
router = APIRouter(tags=["runs"])

Limit = Annotated[int, Query(ge=1, le=1000, description="Page size.")]
Offset = Annotated[int, Query(ge=0, le=10**9)]


@dataclass(frozen=True)
class RunReader:
    """What a route needs to answer with a run as ``GET /runs/{name}`` shows it."""

    db: Database
    swarm: SwarmProgressCache
    clock: Clock
    settings: Settings

    def out(self, name: str) -> RunOut:
        with self.db.read() as session:
            row = runs.get_run(session, name)
            return views.runs_out(
                session, [row], self.swarm, self.clock(), self.settings.reconciler.heartbeat_timeout_s
            )[0]


async def run_reader(db: DatabaseDep, swarm: SwarmDep, clock: ClockDep, settings: SettingsDep) -> RunReader:
    return RunReader(db, swarm, clock, settings)


RunOutDep = Annotated[RunReader, Depends(run_reader)]


@router.post(ApiPath.runs, status_code=status.HTTP_201_CREATED, summary="Create a run (admin)")
def create_run(
    spec: RunSpec,
    cases: UseCasesDep,
    imports: ImportsDep,
    launchers: LaunchersDep,
    claims: PackageClaimsDep,
    reader: RunOutDep,
    _: Admin,
) -> RunCreated:
    """Validate the spec (launcher options; the package named by ``workdir`` is stored and ships no
    top-level ``worker`` or ``orchestrator``; its requirements install and its classes import and take
    their arguments, in an isolated process), insert a pending run and return it with its join token,
    shown only this once. 409 if the name is taken, 422 for a bad spec; either way the package the spec
    names is deleted unless a run names it (or another create is checking it)."""
    created = cases.create_run(spec, launchers, imports, claims)
    return RunCreated(**reader.out(created.name).model_dump(), join_token=created.join_token)


@router.get(ApiPath.runs, summary="List runs")
def list_runs(
    session: ReadSession,
    swarm: SwarmDep,
    clock: ClockDep,
    settings: SettingsDep,
    full: Reader,
    limit: Limit = 50,
    offset: Offset = 0,
    state: RunState | None = None,
) -> RunList:
    """Runs, newest first, optionally only those in ``state``; ``total`` counts all matches."""
    rows, total = views.list_runs(session, state, limit, offset)
    items = views.runs_out(session, rows, swarm, clock(), settings.reconciler.heartbeat_timeout_s, full)
    return RunList(items=items, total=total, limit=limit, offset=offset)


@router.get(ApiPath.run, summary="Get a run")
def get_run(
    name: str, session: ReadSession, swarm: SwarmDep, clock: ClockDep, settings: SettingsDep, full: Reader
) -> RunOut:
    """The run with live and desired worker counts, progress reported by workers and read from the DHT.
    Without the admin token: the public view (free-form spec values left out, ``redacted``)."""
    run = runs.get_run(session, name)
    return views.runs_out(session, [run], swarm, clock(), settings.reconciler.heartbeat_timeout_s, full)[0]


@router.post(ApiPath.run_scale, summary="Change worker counts (admin)")
def scale_run(name: str, body: ScaleRequest, cases: UseCasesDep, reader: RunOutDep, _: Admin) -> RunOut:
    """422 when desired is outside [min, max]; 409 unless the run is pending or running."""
    cases.scale_run(name, body.desired_workers, body.min_workers, body.max_workers)
    return reader.out(name)


@router.post(ApiPath.run_stop, summary="Stop a run (admin)")
def stop_run(
    name: str, cases: UseCasesDep, reader: RunOutDep, _: Admin, body: StopRequest | None = None
) -> RunOut:
    """Workers are told to stop at their next heartbeat; the run is stopped once none is live.
    A no-op for a stopping or stopped run; 409 for a completed or failed one."""
    cases.stop_run(name, body.reason if body else StopRequest().reason)
    return reader.out(name)


@router.post(ApiPath.run_resume, summary="Resume a stopped, failed or completed run (admin)")
def resume_run(
    name: str, cases: UseCasesDep, reader: RunOutDep, _: Admin, body: ResumeRequest | None = None
) -> RunOut:
    """Back to pending (the reconciler launches workers again, from the latest checkpoint), with a new
    stop condition when ``stop`` is given. 409 unless the run has finished, and for a run that would
    meet its stop condition at once (a completed run needs a higher target)."""
    cases.resume_run(name, body.stop if body else None)
    return reader.out(name)


@router.post(ApiPath.run_join_token, summary="Replace the run's join token (admin)")
def rotate_join_token(name: str, cases: UseCasesDep, _: Admin) -> JoinToken:
    """A new join token, shown only this once; the old one stops working at once (registrations and
    checkpoint downloads with it get 401). Workers that joined keep their worker tokens."""
    return JoinToken(name=name, join_token=cases.rotate_join_token(name))


@router.post(ApiPath.run_revoke_manual, summary="End every worker joined by hand (admin)")
def revoke_manual_workers(name: str, cases: UseCasesDep, _: Admin) -> RevokedWorkers:
    """End every worker of the run joined by hand with its join token (running or lost): their worker
    tokens stop working at once (403), and a running one is told to stop by its next heartbeat. Launched
    workers go on. Replace the join token too (``POST /runs/{name}/join-token``) so that nobody joins
    again with the old one."""
    revoked = cases.revoke_manual_workers(name)
    return RevokedWorkers(name=name, revoked=[str(i) for i in revoked])


@router.delete(ApiPath.run, status_code=status.HTTP_204_NO_CONTENT, summary="Delete a finished run (admin)")
def delete_run(name: str, cases: UseCasesDep, _: Admin) -> Response:
    """Delete a stopped, completed or failed run with its workers, events and checkpoints; 409 otherwise."""
    cases.delete_run(name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get(ApiPath.run_events, summary="A run's events")
def list_events(
    name: str,
    session: ReadSession,
    _: Reader,
    after_id: Annotated[int, Query(ge=0, le=MAX_ID, description="Only events newer than this id.")] = 0,
    limit: Limit = 100,
) -> EventPage:
    run = runs.get_run(session, name)
    return views.events_page(session, run.id, after_id, limit)


@router.get(ApiPath.run_progress, summary="A run's progress series")
def progress(
    name: str,
    session: ReadSession,
    _: Reader,
    max_points: Annotated[int, Query(ge=1, le=10_000, description="Downsample to at most this.")] = 500,
) -> ProgressSeries:
    """Progress samples (live and desired workers at each), the marks of workers that left after a spot
    notice or were lost, and goodput over the last hour: the progress made divided by what a steady
    swarm of the workers held would have made at the run's own best steady per-worker rate."""
    run = runs.get_run(session, name)
    return views.progress_series(session, run, max_points)


@router.get(ApiPath.run_workers, summary="A run's workers")
def list_workers(
    name: str,
    session: ReadSession,
    clock: ClockDep,
    full: Reader,
    limit: Limit = 100,
    offset: Offset = 0,
    state: WorkerState | None = None,
) -> WorkerList:
    """Without the admin token: the public view (launch details that locate nothing, ``redacted``)."""
    run = runs.get_run(session, name)
    items, total = views.list_workers(session, run, state, limit, offset, clock(), full)
    return WorkerList(items=items, total=total, limit=limit, offset=offset)
