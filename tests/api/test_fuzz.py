"""Bad input: the REST API fuzzed from its own OpenAPI schema (tests/support/fuzz.py), and the cases the
fuzzer found, kept as regressions. The app in-process on each database backend, with private reads
(every read needs a token).

The bounded run here sends ``SPOTSWARM_FUZZ_EXAMPLES`` (default 12) generated requests per operation and
caller mix; ``python bench/fuzz_api.py --examples 500 [--postgres]`` is the long run, on a real server.
"""

from __future__ import annotations

import hashlib
import os
import random
from typing import Any

import pytest

from tests.api.conftest import BOTH_BACKENDS
from tests.support import api
from tests.support.fuzz import build_world, fuzz
from tests.support.inprocess import InProcessOrchestrator as Orchestrator
from tests.support.orchestrator import FUZZ_ENV
from tests.support.specs import run_spec
from tests.support.waiting import wait_until
from worker.protocol.paths import CHECKSUM_HEADER

pytestmark = pytest.mark.parametrize("backend", BOTH_BACKENDS, indirect=True)
ORCHESTRATOR_ENV = {**FUZZ_ENV, "SPOTSWARM_PUBLIC_READS": "false"}
EXAMPLES = int(os.environ.get("SPOTSWARM_FUZZ_EXAMPLES", "12"))


@pytest.mark.timeout(240)
def test_generated_requests_get_no_5xx_no_schema_violation_and_nothing_without_the_right_token(
    api_app: Orchestrator,
) -> None:
    with api_app.client(timeout_s=60) as http:
        world = build_world(http, api_app.admin_token, public_reads=False)
        # A fixed seed keeps CI deterministic; SPOTSWARM_FUZZ_SEED explores (bench/fuzz_api.py runs long).
        seed_value = int(os.environ.get("SPOTSWARM_FUZZ_SEED", "20261123"))
        failures = fuzz(world, EXAMPLES, seed_value, shrink=False)
    report = "\n\n".join(f"=== {f.operation}\n{f.message}" for f in failures)
    assert not failures, f"seed {seed_value}: {len(failures)} operation(s) failed\n{report}"


def _worker(api_app: Orchestrator, name: str) -> tuple[str, dict[str, str]]:
    with api_app.admin() as http:
        join = http.post(api.runs(), json=run_spec(name)).json()["join_token"]
    with api_app.client(join) as http:
        reply = http.post(api.register(), json={"hostname": "h"}).json()
    return reply["worker_id"], {"Authorization": f"Bearer {reply['worker_token']}"}


TOO_BIG_IDS = [2**31, 2**63, 10**30]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("worker_id", TOO_BIG_IDS)
def test_worker_ids_beyond_the_id_column_are_refused_not_500(api_app: Orchestrator, worker_id: int) -> None:
    _, auth = _worker(api_app, f"big-id-{random.randrange(10**6)}")
    data = b"x"
    with api_app.admin() as http:
        answers = [
            http.post(api.heartbeat(worker_id), json={}, headers=auth),
            http.post(api.deregister(worker_id), json={"reason": "error"}, headers=auth),
            http.put(
                api.checkpoint_upload(worker_id, 1),
                content=data,
                headers={**auth, CHECKSUM_HEADER: hashlib.sha256(data).hexdigest()},
            ),
            http.get(api.run_worker_log("any", worker_id)),
            http.get(api.run_events("any"), params={"after_id": worker_id}),
        ]
    assert [a.status_code for a in answers] == [422] * 5, [a.text for a in answers]


BAD_SPECS: list[dict[str, Any]] = [
    {"checkpoint_every_epochs": 10**20},
    {"stop": {"target_epochs": 2**63}},
    {"stop": {"target_samples": 10**30}},
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("overrides", BAD_SPECS)
def test_numbers_the_database_cannot_hold_are_422(api_app: Orchestrator, overrides: dict[str, Any]) -> None:
    with api_app.admin() as http:
        answer = http.post(api.runs(), json=run_spec(f"bad-{random.randrange(10**6)}", **overrides))
    assert answer.status_code == 422, answer.text


@pytest.mark.timeout(120)
def test_nan_in_run_arguments_is_422(api_app: Orchestrator) -> None:
    body = '{"name": "nan-args", "module": "a:B", "datamodule": "a:B", "target_batch_size": 4, '
    body += '"batch_size": 2, "min_workers": 0, "desired_workers": 0, "module_args": {"lr": NaN}}'
    with api_app.admin() as http:
        answer = http.post(api.runs(), content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 422 and "not plain JSON" in answer.text, answer.text


@pytest.mark.timeout(120)
def test_nul_characters_are_refused_at_the_edge(api_app: Orchestrator) -> None:
    """PostgreSQL text cannot hold NUL: without checks at the edge these were 500s there."""
    name = f"nul-{random.randrange(10**6)}"
    worker_id, auth = _worker(api_app, name)
    with api_app.admin() as http:
        assert http.get("/api/v1/runs/a%00b").status_code == 404
        assert http.post(api.run_stop(name), json={"reason": "a\x00b"}).status_code == 422
        deregister = {"reason": "error", "message": "a\x00b"}
        assert http.post(api.deregister(worker_id), json=deregister, headers=auth).status_code == 422
        heartbeat = {"visible_maddrs": ["/ip4/1.2.3.4\x00"]}
        assert http.post(api.heartbeat(worker_id), json=heartbeat, headers=auth).status_code == 422
        join = http.post(api.runs(), json=run_spec(f"{name}-2")).json()["join_token"]
    with api_app.client(join) as http:
        assert http.post(api.register(), json={"hostname": "a\x00b"}).status_code == 422
        assert http.post(api.register(), json={"request_id": "../x"}).status_code == 422


@pytest.mark.timeout(120)
def test_a_heartbeat_with_huge_counters_is_refused_and_cannot_block_other_writes(
    api_app: Orchestrator,
) -> None:
    """Before: accepted, then every batch write failed on it (all workers' heartbeats lost) until the
    worker sent a smaller number."""
    name = f"poison-{random.randrange(10**6)}"
    bad_id, bad_auth = _worker(api_app, name)
    good_id, good_auth = _worker(api_app, f"{name}-2")
    with api_app.client() as http:
        for field in ("samples", "local_step", "swarm_epoch", "num_peers"):
            answer = http.post(api.heartbeat(bad_id), json={field: 10**20}, headers=bad_auth)
            assert answer.status_code == 422, (field, answer.text)
        assert http.post(api.heartbeat(good_id), json={"samples": 77}, headers=good_auth).status_code == 200

    def stored() -> bool:
        with api_app.admin() as http:
            workers = http.get(api.run_workers(f"{name}-2")).json()["items"]
        return bool(workers) and workers[0]["samples"] == 77

    wait_until(stored, 15, message="the good worker's heartbeat is written")


@pytest.mark.timeout(60)
def test_the_schema_documents_error_answers_and_checkpoint_bytes(api_app: Orchestrator) -> None:
    with api_app.client() as http:
        schema = http.get("/openapi.json").json()
    scale = schema["paths"]["/api/v1/runs/{name}/scale"]["post"]["responses"]
    assert {"401", "403", "404", "409", "422", "503"} <= set(scale)
    assert scale["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorOut")
    download = schema["paths"]["/api/v1/runs/{name}/checkpoints/latest/download"]["get"]["responses"]
    assert list(download["200"]["content"]) == ["application/octet-stream"]
