"""``/api/v1/peers`` (the orchestrator's DHT addresses) and ``/api/v1/runs/{name}/peers`` (initial peers
for a run's workers: the orchestrator first, then recent workers, freshest first)."""

from __future__ import annotations

from fastapi import APIRouter

from orchestrator.api.deps import (
    AdminTokenHash,
    OwnPeers,
    Reader,
    ReadSession,
    SettingsDep,
    Token,
    check_run_access,
)
from orchestrator.domain import runs, views
from worker.protocol.paths import ApiPath
from worker.protocol.workers import PeerList

router = APIRouter(tags=["peers"])


@router.get(ApiPath.peers, summary="The orchestrator's DHT multiaddrs")
def orchestrator_peers(own: OwnPeers, _: Reader) -> PeerList:
    """Stable across restarts (fixed port, persistent identity); announce addresses first when set."""
    return PeerList(initial_peers=own, orchestrator_peers=own)


@router.get(ApiPath.run_peers, summary="Initial peers for a run")
def run_peers(
    name: str,
    own: OwnPeers,
    session: ReadSession,
    settings: SettingsDep,
    admin_token_hash: AdminTokenHash,
    token: Token,
) -> PeerList:
    """Public when reads are public; else the admin token, the join token or a worker token of the run."""
    run = runs.get_run(session, name)
    if not settings.public_reads:
        check_run_access(admin_token_hash, session, run, token)
    workers = [m for m in views.worker_peers(session, run.id) if m not in own]
    return PeerList(initial_peers=own + workers, orchestrator_peers=own, worker_peers=workers)
