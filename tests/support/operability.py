"""Helpers of the operability tests (metrics, peer lists, worker logs), on the app in-process or on a
real `spotswarm serve`: runs, launch intents written as the reconcile loop writes them, workers joined
through the agent's own client, and scrapes of /metrics."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from orchestrator.clock import utc_now
from orchestrator.domain import runs, workers
from tests.support.orchestrator import HAND_ONLY
from tests.support.orchestrator import ApiServer as Orchestrator
from tests.support.specs import create_run
from tests.support.waiting import wait_until
from worker.agent.client import OrchestratorClient
from worker.protocol.workers import DeregisterReason, Heartbeat, WorkerRegister

# Reads need the admin token here (the rule /metrics and the peer lists follow too).
OPERABILITY_ENV = {**HAND_ONLY, "SPOTSWARM_PUBLIC_READS": "false"}


def create(orch: Orchestrator, **overrides: Any) -> tuple[str, str]:
    return create_run(orch, "ops", **overrides)


def launch_intent(orch: Orchestrator, name: str, details: dict[str, Any] | None = None) -> tuple[str, str]:
    """A ``launching`` row of the run's launcher (local), as the reconcile loop writes it: its request id
    and launch token."""
    with orch.database() as database, database.begin() as session:
        intent = workers.create_launch_intent(session, runs.get_run(session, name), utc_now(), details)
        return intent.worker.request_id, intent.token


@dataclass
class Joined:
    """A worker joined through the real API that reports what a test tells it to."""

    client: OrchestratorClient
    worker_id: str

    def beat(self, **numbers: Any) -> None:
        self.client.heartbeat(self.worker_id, Heartbeat(**numbers))

    def leave(self, reason: DeregisterReason, message: str | None = None) -> None:
        self.client.deregister(self.worker_id, reason, message)


def join(orch: Orchestrator, token: str, request_id: str | None = None) -> Joined:
    client = OrchestratorClient(orch.url, retries=1, backoff_s=0.1, transport=orch.transport)
    registered = client.register(token, WorkerRegister(request_id=request_id, hostname="ops-box"))
    client.token = registered.worker_token
    return Joined(client, registered.worker_id)


def local_worker_with_log(orch: Orchestrator, name: str, text: str) -> tuple[Joined, Path]:
    """A worker of the local launcher (joined with its launch token) and its log, holding ``text``."""
    request_id, launch_token = launch_intent(orch, name)
    worker = join(orch, launch_token, request_id)
    log = orch.data_dir / "workers" / f"{request_id}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(text)
    return worker, log


def admin_get(orch: Orchestrator, path: str, **params: Any) -> Any:
    with orch.admin() as http:
        response = http.get(path, params=params)
    response.raise_for_status()
    return response.json()


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(orch: Orchestrator) -> Samples:
    """Every sample of /metrics by (name, sorted labels)."""
    with orch.admin() as http:
        response = http.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def scrape_until(orch: Orchestrator, ready: Callable[[Samples], bool], timeout_s: float = 15) -> Samples:
    """Scrape until ``ready`` holds for the samples; return them."""
    last: list[Samples] = [{}]

    def check() -> bool:
        last[0] = scrape(orch)
        return ready(last[0])

    wait_until(check, timeout_s, message="metrics caught up")
    return last[0]
