"""A burst of hand-joined workers (300 at once, as a spot market hands capacity back) on SQLite and
PostgreSQL: every one registers, each with its own slot, and the server answers overload only with a
429 or 503 that says when to come back (``Retry-After``), which the client obeys."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import httpx
import pytest

from bench.api_load import JOIN_AT_ONCE, ONE_ADDRESS
from tests.support.orchestrator import HAND_ONLY, Orchestrator, OrchestratorFactory
from tests.support.specs import run_spec

BURST = 300
CONNECTIONS = 64
GIVE_UP_S = 45.0  # a registration still refused after this long has failed for good


@dataclass
class Answers:
    """Every answer of the burst: the workers registered and the refusals on the way."""

    workers: dict[str, int] = field(default_factory=dict)  # worker id -> worker index
    refusals: list[tuple[int, str | None, str]] = field(default_factory=list)  # status, Retry-After, body
    failed: list[str] = field(default_factory=list)


async def _burst(url: str, join_token: str, answers: Answers) -> None:
    limits = httpx.Limits(max_connections=CONNECTIONS)
    headers = {"Authorization": f"Bearer {join_token}"}
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits, headers=headers) as http:

        async def one(index: int) -> None:
            deadline = asyncio.get_running_loop().time() + GIVE_UP_S
            while True:
                reply = await http.post("/api/v1/workers/register", json={"hostname": f"burst-{index}"})
                if reply.status_code == 200:
                    answers.workers[reply.json()["worker_id"]] = reply.json()["worker_index"]
                    return
                retry_after = reply.headers.get("Retry-After")
                answers.refusals.append((reply.status_code, retry_after, reply.text[:200]))
                if asyncio.get_running_loop().time() > deadline or retry_after is None:
                    answers.failed.append(f"burst-{index}: {reply.status_code} {reply.text[:200]}")
                    return
                await asyncio.sleep(float(retry_after))

        await asyncio.gather(*(one(i) for i in range(BURST)))


def _start(factory: OrchestratorFactory, backend: str) -> Orchestrator:
    return factory({**HAND_ONLY, **JOIN_AT_ONCE, **ONE_ADDRESS}, backend=backend)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_burst_of_joins_all_register_with_their_own_slots(
    orchestrator_factory: OrchestratorFactory, backend: str
) -> None:
    orch = _start(orchestrator_factory, backend)
    with orch.admin() as http:
        created = http.post("/api/v1/runs", json=run_spec(f"burst-{backend}", max_workers=1000))
        assert created.status_code == 201, created.text
    answers = Answers()
    asyncio.run(_burst(orch.url, created.json()["join_token"], answers))

    assert answers.failed == [], answers.failed[:5]
    # overload is answered with a time to come back, never a bare failure
    assert all(status in (429, 503) and after for status, after, _ in answers.refusals), answers.refusals[:5]
    assert len(answers.workers) == BURST
    assert sorted(answers.workers.values()) == list(range(BURST))  # no slot twice, none skipped
    with orch.admin() as http:
        listed = http.get(f"/api/v1/runs/burst-{backend}/workers", params={"limit": 1000}).json()["items"]
    assert len(listed) == BURST and {w["state"] for w in listed} == {"running"}
