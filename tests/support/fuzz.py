"""The REST API fuzzed from its own OpenAPI schema (schemathesis cases, driven by hypothesis), and an
orchestrator to fuzz.

Every operation of ``/openapi.json`` gets generated requests, valid and invalid, sent by a mix of callers
(no token, garbage, the admin token, two runs' join tokens, three workers' tokens) against a small world of
real runs, workers and a checkpoint. Each answer must:

- not be a server error (5xx), and match the schema: documented status, content type, body schema;
- grant nothing to the wrong caller: admin calls need the admin token, worker calls that worker's token,
  downloads a token of the run, and with ``--no-public-reads`` every read the admin token (a run's peers
  also a token of that run); 401/403 answers carry only ``{"detail": "..."}``;
- never contain a token (or token digest) the caller did not already hold.

The requests go through any ``httpx.Client``: one on the app in-process (the bounded run of
``tests/api/test_fuzz.py``) or on a server (``python bench/fuzz_api.py``, the long run, which starts one
with :func:`fuzz_orchestrator`: `spotswarm serve` on SQLite or on a private PostgreSQL). Import checks
are off there: nearly every generated import path fails them, which would hide the database layer from
the fuzzer (the import check has its own tests).
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.errors import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.support import api
from tests.support.checkpoint_files import checkpoint_bytes
from tests.support.orchestrator import FUZZ_ENV, Orchestrator, start_orchestrator
from tests.support.postgres import PostgresCluster, running_postgres
from tests.support.processes import ProcessRegistry
from tests.support.waiting import wait_until

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
# Not checked, and why: positive_data_acceptance (a run spec's min <= desired <= max and an upload's
# checksum cannot be written in JSON schema, so schema-valid requests are rightly refused);
# allow_header_conformance (Starlette's 405 lists the methods of the first route matching the path only).

CALLERS = ("none", "garbage", "generated", "admin", "join:a", "join:b", "worker:0", "worker:1", "worker:2")
ADMIN_OPS = {
    ("POST", api.runs()),
    ("DELETE", "/api/v1/runs/{name}"),
    ("POST", "/api/v1/runs/{name}/scale"),
    ("POST", "/api/v1/runs/{name}/stop"),
    ("POST", "/api/v1/runs/{name}/resume"),
    ("POST", "/api/v1/runs/{name}/join-token"),
    ("GET", "/api/v1/runs/{name}/workers/{worker_id}/log"),  # logs hold whatever user code prints
    ("DELETE", "/api/v1/runs/{name}/checkpoints/{epoch}"),
    ("DELETE", "/api/v1/runs/{name}/checkpoints"),
    ("POST", "/api/v1/runs/{name}/manual-workers/revoke"),
}
WORKER_OPS = {
    ("POST", "/api/v1/workers/{worker_id}/heartbeat"),
    ("POST", "/api/v1/workers/{worker_id}/deregister"),
    ("PUT", "/api/v1/workers/{worker_id}/checkpoints/{epoch}"),
    ("POST", "/api/v1/workers/{worker_id}/swarm-token"),
    ("POST", "/api/v1/workers/{worker_id}/resume-failures"),
}
REGISTER_OP = ("POST", api.register())
RUN_TOKEN_OPS = {  # the admin token, the run's join token or one of its worker tokens
    ("GET", "/api/v1/runs/{name}/checkpoints/latest/download"),
    ("GET", "/api/v1/runs/{name}/checkpoints/{epoch}/download"),
}
RUN_PEERS_OP = ("GET", "/api/v1/runs/{name}/peers")
# Open to anyone: liveness, readiness, and the swarm's token-signing public key.
OPEN_OPS = {("GET", "/healthz"), ("GET", "/readyz"), ("GET", api.swarm_auth())}
# Any other operation follows the read rule (public reads, or the admin token): a new endpoint that
# gives more away fails here until it is classified above.
# Destructive operations go last so that the world stays useful for the others as long as possible.
LAST = [
    ("DELETE", "/api/v1/runs/{name}/checkpoints/{epoch}"),
    ("DELETE", "/api/v1/runs/{name}/checkpoints"),
    ("POST", "/api/v1/runs/{name}/manual-workers/revoke"),
    ("POST", "/api/v1/runs/{name}/join-token"),
    ("POST", "/api/v1/workers/{worker_id}/deregister"),
    ("DELETE", "/api/v1/runs/{name}"),
]


@dataclass
class World:
    """What the fuzzer knows: two runs (a, b) and three workers (0, 1 in run a; 2 in run b)."""

    http: httpx.Client  # on the orchestrator, sending no token of its own
    admin_token: str
    public_reads: bool
    join: dict[str, str] = field(default_factory=dict)  # "a" -> join token
    run_names: dict[str, str] = field(default_factory=dict)  # "a" -> run name
    workers: list[tuple[str, str, str]] = field(default_factory=list)  # (worker id, token, run key)

    @property
    def base_url(self) -> str:
        return str(self.http.base_url).rstrip("/")

    def token(self, caller: str) -> str | None:
        if caller == "admin":
            return self.admin_token
        if caller.startswith("join:"):
            return self.join[caller[5:]]
        if caller.startswith("worker:"):
            return self.workers[int(caller[7:])][1]
        return None

    def secrets(self) -> dict[str, str]:
        """Every token the world holds, by caller name (tokens and their SHA-256 digests must not leak)."""
        names = [
            "admin",
            *(f"join:{k}" for k in self.join),
            *(f"worker:{i}" for i in range(len(self.workers))),
        ]
        return {name: token for name in names if (token := self.token(name))}

    def run_of(self, caller: str) -> str | None:
        if caller.startswith("join:"):
            return self.run_names[caller[5:]]
        if caller.startswith("worker:"):
            return self.run_names[self.workers[int(caller[7:])][2]]
        return None


def build_world(http: httpx.Client, admin_token: str, public_reads: bool, prefix: str = "fuzz") -> World:
    """Create runs ``<prefix>-a`` and ``<prefix>-b``, register workers and upload one checkpoint."""
    world = World(http, admin_token, public_reads)
    admin = {"Authorization": f"Bearer {admin_token}"}
    for key in ("a", "b"):
        name = f"{prefix}-{key}-{random.randrange(16**6):06x}"
        spec = {
            "name": name,
            "module": "worker.examples.digits:DigitsModule",
            "datamodule": "worker.examples.digits:DigitsDataModule",
            "target_batch_size": 64,
            "batch_size": 8,
            "min_workers": 0,
            "desired_workers": 0,
            "hand_joined_checkpoint": True,  # its hand-joined worker uploads the checkpoint
        }
        response = http.post(api.runs(), json=spec, headers=admin)
        response.raise_for_status()
        world.join[key], world.run_names[key] = response.json()["join_token"], name
    for key in ("a", "a", "b"):
        auth = {"Authorization": f"Bearer {world.join[key]}"}
        response = http.post(api.register(), json={"hostname": "fuzz"}, headers=auth)
        response.raise_for_status()
        world.workers.append((response.json()["worker_id"], response.json()["worker_token"], key))
    worker_id, token, _ = world.workers[0]
    auth = {"Authorization": f"Bearer {token}"}
    beat = api.heartbeat(worker_id)
    wait_until(  # only the run's checkpointer uploads: wait for the election
        lambda: http.post(beat, json={}, headers=auth).json()["checkpointer"],
        30,
        message=f"worker {worker_id} becomes its run's checkpointer",
    )
    data = checkpoint_bytes(b"a checkpoint the fuzzer must never damage")
    headers = {**auth, "X-Checksum-Sha256": hashlib.sha256(data).hexdigest()}
    http.put(api.checkpoint_upload(worker_id, 1), content=data, headers=headers).raise_for_status()
    return world


def allowed(world: World, key: tuple[str, str], caller: str, path_params: dict[str, Any]) -> bool:
    """Whether ``caller`` may get a 2xx answer from operation ``key`` with these path parameters."""
    if key in OPEN_OPS or key == ("GET", "/openapi.json"):
        return True
    if key in ADMIN_OPS:
        return caller == "admin"
    if key in WORKER_OPS:
        return caller.startswith("worker:") and world.workers[int(caller[7:])][0] == str(
            path_params.get("worker_id")
        )
    if key == REGISTER_OP:
        return caller.startswith(("join:", "worker:"))
    if key in RUN_TOKEN_OPS or (key == RUN_PEERS_OP and not world.public_reads):
        return caller == "admin" or world.run_of(caller) == path_params.get("name")
    return world.public_reads or caller == "admin"


def auth_violation(world: World, key: tuple[str, str], caller: str, case: Any, response: Any) -> str | None:
    """A description of what the answer gave away, or None when it respects the auth rule."""
    status, body = response.status_code, response.text
    if 200 <= status < 300 and not allowed(world, key, caller, dict(case.path_parameters or {})):
        return f"{caller} got {status} from {key[0]} {key[1]}"
    if status in (401, 403):
        try:
            payload = response.json()
        except ValueError:
            return f"{status} answer is not JSON"
        if set(payload) != {"detail"} or not isinstance(payload["detail"], str):
            return f"{status} answer carries more than a detail: {body[:200]}"
    own = world.token(caller)
    for name, token in world.secrets().items():
        if token == own:
            continue
        if token in body or hashlib.sha256(token.encode()).hexdigest() in body:
            return f"the answer to {caller} contains the token of {name}"
    return None


def _choose_caller(case: Any, caller: str, world: World) -> None:
    if caller == "generated":
        return  # whatever schemathesis generated for the authorization header (often nothing)
    case.headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
    token = world.token(caller) or ("ssw_" + "x" * 43 if caller == "garbage" else None)
    if token:
        case.headers["Authorization"] = f"Bearer {token}"


def _aim(case: Any, world: World, rng: random.Random) -> None:
    """Point most cases at real runs and workers (random ids alone would only ever meet 404)."""
    params = case.path_parameters
    if not params:
        return
    if "name" in params and rng.random() < 0.8:
        params["name"] = world.run_names[rng.choice(["a", "b"])]
    if "worker_id" in params and rng.random() < 0.8:
        params["worker_id"] = int(rng.choice(world.workers)[0])
    if "epoch" in params and rng.random() < 0.5:
        params["epoch"] = rng.choice([1, 2, 3])
    if case.operation.method.upper() == "PUT" and isinstance(case.body, (bytes, str)) and rng.random() < 0.5:
        raw = case.body.encode() if isinstance(case.body, str) else case.body
        case.headers = {**(case.headers or {}), "X-Checksum-Sha256": hashlib.sha256(raw).hexdigest()}


def send(http: httpx.Client, case: Any) -> httpx.Response:
    """Send a generated case through ``http`` (a client on a server or on the app in-process), as
    schemathesis' own transport would: JSON encoded without NaN, raw bodies as they are."""
    sent = case.as_transport_kwargs(base_url=str(http.base_url).rstrip("/"))
    body: dict[str, Any] = {}
    if "json" in sent:
        body["content"] = json.dumps(sent["json"], allow_nan=False).encode()
    elif isinstance(sent.get("data"), (bytes, str)):
        body["content"] = sent["data"]
    elif sent.get("data") is not None:
        body["data"] = sent["data"]
    elif sent.get("files") is not None:
        body["files"] = sent["files"]
    request = http.build_request(
        sent["method"],
        sent["url"],
        headers=sent.get("headers"),
        params=sent.get("params"),
        cookies=sent.get("cookies") or None,
        timeout=60,
        **body,
    )
    return http.send(request)


@dataclass
class Failure:
    operation: str
    message: str


def fuzz_operation(
    operation: Any, world: World, examples: int, seed_value: int, shrink: bool
) -> Failure | None:
    """Run ``examples`` generated cases against one operation; the first failure found, or None."""
    key = (operation.method.upper(), operation.path)
    strategy = st.one_of(
        operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
        operation.as_strategy(generation_mode=GenerationMode.NEGATIVE),
    )

    @seed(seed_value)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=False,
        phases=[Phase.generate, Phase.shrink] if shrink else [Phase.generate],
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )
    @given(case=strategy, caller=st.sampled_from(CALLERS), salt=st.integers(0, 2**32 - 1))
    def check(case: Any, caller: str, salt: int) -> None:
        _choose_caller(case, caller, world)
        _aim(case, world, random.Random(salt))
        response = send(world.http, case)
        case.validate_response(response, checks=CHECKS, transport_kwargs={"base_url": world.base_url})
        problem = auth_violation(world, key, caller, case, response)
        if problem:
            curl = case.as_curl_command(headers=dict(response.request.headers), base_url=world.base_url)
            raise AssertionError(f"{problem}\n    {curl}")

    label = f"{key[0]} {key[1]}"
    try:
        check()
    except (AssertionError, FailureGroup) as exc:
        return Failure(label, str(exc))
    except Exception as exc:  # noqa: BLE001 - a crash of the harness or transport is a finding too
        return Failure(label, f"{type(exc).__name__}: {exc}")
    return None


def fuzz(
    world: World,
    examples: int,
    seed_value: int,
    shrink: bool = True,
    progress: Callable[[str, Failure | None, float], None] | None = None,
) -> list[Failure]:
    """Fuzz every operation of the live schema in turn (destructive ones last); all failures found."""
    answer = world.http.get("/openapi.json")
    answer.raise_for_status()
    schema = schemathesis.openapi.from_dict(answer.json())
    operations = [op.ok() for op in schema.get_all_operations()]
    operations.sort(key=lambda op: LAST.index(k) if (k := (op.method.upper(), op.path)) in LAST else -1)
    failures = []
    for index, operation in enumerate(operations):
        started = time.monotonic()
        failure = fuzz_operation(operation, world, examples, seed_value + index, shrink)
        if failure:
            failures.append(failure)
        if progress:
            progress(f"{operation.method.upper()} {operation.path}", failure, time.monotonic() - started)
    return failures


@contextmanager
def fuzz_orchestrator(
    root: Path, postgres: bool | PostgresCluster = False, public_reads: bool = False
) -> Iterator[Orchestrator]:
    """Start the server under ``root`` (and a PostgreSQL cluster when ``postgres`` is True; pass a running
    cluster to use it instead); everything started here is stopped on exit."""
    registry = ProcessRegistry(root)
    with ExitStack() as stack:
        cluster = postgres if isinstance(postgres, PostgresCluster) else None
        if postgres is True:
            cluster = stack.enter_context(running_postgres())
        stack.callback(registry.kill_all)
        db_url = cluster.create_database(f"fuzz_{root.name.replace('-', '_').lower()}") if cluster else None
        env = {**FUZZ_ENV, "SPOTSWARM_PUBLIC_READS": "true" if public_reads else "false"}
        yield start_orchestrator(registry, root / "data", db_url, extra_env=env)
