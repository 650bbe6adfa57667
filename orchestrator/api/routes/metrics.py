"""``GET /metrics``: the orchestrator's Prometheus metrics (text format), under the read rule.

Public when reads are public (the default: the values are counts and numbers, never secrets); with
``--no-public-reads`` Prometheus sends the admin token (``authorization: {credentials_file: ...}``).
The handler is synchronous on purpose: collecting reads the database, so it runs in the thread pool.
"""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from orchestrator.api.deps import MetricsDep, Reader

router = APIRouter(tags=["metrics"])


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
def metrics(service: MetricsDep, _: Reader) -> Response:
    """Per-run values read now from the database and the DHT cache, and the service's counters."""
    return Response(generate_latest(service.registry), media_type=CONTENT_TYPE_LATEST)
