"""``/healthz`` (the process answers) and ``/readyz`` (the database and the DHT work: 503 otherwise)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError

from orchestrator.api.deps import DatabaseDep, DhtDep
from orchestrator.schemas import Health, Readiness

router = APIRouter(tags=["health"])
READY_DB_TIMEOUT_S = 5.0


@router.get("/healthz", summary="Liveness")
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", summary="Readiness", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(db: DatabaseDep, dht_peer: DhtDep) -> JSONResponse:
    detail: dict[str, str] = {}
    try:
        async with asyncio.timeout(READY_DB_TIMEOUT_S):
            await asyncio.to_thread(db.ping)
        database = True
    except (TimeoutError, SQLAlchemyError) as exc:
        database = False
        detail["database"] = type(exc).__name__
    dht = dht_peer.alive()
    if not dht:
        detail["dht"] = "the DHT peer is not running"
    ready = database and dht
    body = Readiness(status="ready" if ready else "unavailable", database=database, dht=dht, detail=detail)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)
