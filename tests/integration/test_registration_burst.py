"""A burst of hand-joined workers (300 at once, as a spot market hands capacity back) on SQLite and
PostgreSQL: every one registers, each with its own slot, and the server answers overload only with a
429 or 503 that says when to come back (``Retry-After``), which the client obeys. Registrations that
arrive together share a transaction: the ones refused in it (a full run, an unknown token) are refused
alone."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import httpx
import pytest

from bench.api_load import JOIN_AT_ONCE, ONE_ADDRESS
from tests.support import api
from tests.support.orchestrator import HAND_ONLY, Orchestrator, OrchestratorFactory
from tests.support.specs import run_spec

BURST = 300
EXTRA = 10  # joins beyond the run's max_workers: refused with 409, the others unharmed
CONNECTIONS = 64
GIVE_UP_S = 45.0  # a registration still refused after this long has failed for good


@dataclass
class Answers:
    """Every answer of the burst: the workers registered and the refusals on the way."""

    workers: dict[str, int] = field(default_factory=dict)  # worker id -> worker index
    refusals: list[tuple[int, str | None, str]] = field(default_factory=list)  # status, Retry-After, body
    failed: list[str] = field(default_factory=list)
    refused_for_good: list[int] = field(default_factory=list)  # 401, 409: statuses of final refusals


async def _burst(url: str, join_token: str, answers: Answers) -> None:
    limits = httpx.Limits(max_connections=CONNECTIONS)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:

        async def one(index: int, token: str = join_token) -> None:
            deadline = asyncio.get_running_loop().time() + GIVE_UP_S
            auth = {"Authorization": f"Bearer {token}"}
            while True:
                body = {"hostname": f"burst-{index}"}
                reply = await http.post(api.register(), json=body, headers=auth)
                if reply.status_code == 200:
                    answers.workers[reply.json()["worker_id"]] = reply.json()["worker_index"]
                    return
                if reply.status_code in (401, 409):
                    answers.refused_for_good.append(reply.status_code)
                    return
                retry_after = reply.headers.get("Retry-After")
                answers.refusals.append((reply.status_code, retry_after, reply.text[:200]))
                if asyncio.get_running_loop().time() > deadline or retry_after is None:
                    answers.failed.append(f"burst-{index}: {reply.status_code} {reply.text[:200]}")
                    return
                await asyncio.sleep(float(retry_after))

        unknown = join_token + "x"
        joins = [one(i) for i in range(BURST + EXTRA)] + [one(-i, unknown) for i in range(1, 6)]
        await asyncio.gather(*joins)


def _start(factory: OrchestratorFactory, backend: str) -> Orchestrator:
    return factory({**HAND_ONLY, **JOIN_AT_ONCE, **ONE_ADDRESS}, backend=backend)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_burst_of_joins_all_register_with_their_own_slots(
    orchestrator_factory: OrchestratorFactory, backend: str
) -> None:
    orch = _start(orchestrator_factory, backend)
    with orch.admin() as http:
        created = http.post(api.runs(), json=run_spec(f"burst-{backend}", max_workers=BURST))
        assert created.status_code == 201, created.text
    answers = Answers()
    asyncio.run(_burst(orch.url, created.json()["join_token"], answers))

    assert answers.failed == [], answers.failed[:5]
    # overload is answered with a time to come back, never a bare failure
    assert all(status in (429, 503) and after for status, after, _ in answers.refusals), answers.refusals[:5]
    assert len(answers.workers) == BURST
    assert sorted(answers.refused_for_good) == [401] * 5 + [409] * EXTRA  # the full run, the unknown token
    assert sorted(answers.workers.values()) == list(range(BURST))  # no slot twice, none skipped
    with orch.admin() as http:
        listed = http.get(api.run_workers(f"burst-{backend}"), params={"limit": 1000}).json()["items"]
    assert len(listed) == BURST and {w["state"] for w in listed} == {"running"}
