"""``/api/v1/peers`` (the orchestrator's DHT addresses) and ``/api/v1/runs/{name}/peers`` (initial peers
for a run's workers: the orchestrator first, then recent workers, freshest first)."""

from __future__ import annotations

from fastapi import APIRouter

from orchestrator.api.deps import Ctx, Reader, Token, check_run_access
from orchestrator.domain import runs, views
from worker.wire import ApiPath, PeerList

router = APIRouter(tags=["peers"])


@router.get(ApiPath.peers, summary="The orchestrator's DHT multiaddrs")
def orchestrator_peers(ctx: Ctx, _: Reader) -> PeerList:
    """Stable across restarts (fixed port, persistent identity); announce addresses first when set."""
    peers = ctx.orchestrator_peers()
    return PeerList(initial_peers=peers, orchestrator_peers=peers)


@router.get(ApiPath.run_peers, summary="Initial peers for a run")
def run_peers(name: str, ctx: Ctx, token: Token) -> PeerList:
    """Public when reads are public; else the admin token, the join token or a worker token of the run."""
    own = ctx.orchestrator_peers()
    with ctx.db.read() as session:
        run = runs.get_run(session, name)
        if not ctx.settings.public_reads:
            check_run_access(ctx, session, run, token)
        workers = [m for m in views.worker_peers(session, run.id) if m not in own]
    return PeerList(initial_peers=own + workers, orchestrator_peers=own, worker_peers=workers)
