"""``/healthz``, ``/readyz`` and the API's own documents (``/openapi.json``, ``/docs``)."""

from __future__ import annotations

import pytest

from tests.api.conftest import BOTH_BACKENDS
from tests.support.inprocess import InProcessOrchestrator as Orchestrator

pytestmark = pytest.mark.parametrize("backend", BOTH_BACKENDS, indirect=True)


@pytest.mark.timeout(60)
def test_health_readiness_and_openapi(api_app: Orchestrator) -> None:
    with api_app.client() as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        ready = http.get("/readyz").json()
        assert ready["database"] and ready["dht"]
        assert http.get("/docs").status_code == 200
        paths = http.get("/openapi.json").json()["paths"]
    assert "/api/v1/runs/{name}/scale" in paths and "/api/v1/workers/{worker_id}/heartbeat" in paths
