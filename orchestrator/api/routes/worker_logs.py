"""``GET /api/v1/runs/{name}/workers/{worker_id}/log``: the tail of a worker's log, size-bounded.

Admin token only, even with public reads: a log holds whatever the user's code prints. ``tail_bytes``
(at most 1 MiB) bounds the answer; the file is never read whole. ``from_offset`` (a previous answer's
``next_offset``) returns what was written since, from there on: how ``runs logs --worker ID -f``
follows. 404 for an unknown run or worker or a log not written yet, 409 for a worker whose log is not
kept by the orchestrator (joined by hand, EC2).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from orchestrator.api.deps import Admin, ReadSession, SettingsDep, WorkerId
from orchestrator.domain import runs
from orchestrator.errors import NotFound
from orchestrator.launchers.worker_logs import (
    DEFAULT_TAIL_BYTES,
    MAX_TAIL_BYTES,
    read_from,
    read_tail,
    worker_log_path,
)
from worker.protocol.paths import ApiPath

router = APIRouter(tags=["runs"])


class WorkerLog(BaseModel):
    """The end of a worker's log."""

    run: str
    worker_id: str
    size_bytes: int = Field(description="Size of the whole log now.")
    offset: int = Field(description="Where ``text`` starts in the log (a line start when cut).")
    truncated: bool = Field(description="True when the log holds more before ``offset``.")
    text: str
    next_offset: int = Field(
        description="Where ``text`` ends: pass it as ``from_offset`` to read what follows."
    )


@router.get(ApiPath.run_worker_log, summary="The tail of a worker's log (admin)")
def worker_log(
    name: str,
    worker_id: WorkerId,
    session: ReadSession,
    settings: SettingsDep,
    _: Admin,
    tail_bytes: Annotated[
        int, Query(ge=1, le=MAX_TAIL_BYTES, description="Return at most this many bytes from the end.")
    ] = DEFAULT_TAIL_BYTES,
    from_offset: Annotated[
        int | None,
        Query(ge=0, description="Read forward from this byte (a previous next_offset) instead of the end."),
    ] = None,
) -> WorkerLog:
    run = runs.get_run(session, name)
    worker = runs.get_worker(session, worker_id)
    if worker.run_id != run.id:
        raise NotFound(f"worker {worker_id} not found in run {name!r}")
    path = worker_log_path(settings.data_dir, worker.id, worker.launcher, worker.manual, worker.request_id)
    tail = read_tail(path, tail_bytes) if from_offset is None else read_from(path, from_offset, tail_bytes)
    return WorkerLog(
        run=name,
        worker_id=str(worker_id),
        size_bytes=tail.size_bytes,
        offset=tail.offset,
        truncated=tail.truncated,
        text=tail.text,
        next_offset=tail.next_offset,
    )
