"""The worker's API client against an in-process fake server (httpx.MockTransport): retries and errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import httpx
import pytest

from tests.support import api
from worker.agent.client import (
    ChecksumMismatch,
    Conflict,
    OrchestratorClient,
    Rejected,
    Unauthorized,
    Unreachable,
)
from worker.protocol.paths import CHECKSUM_HEADER
from worker.protocol.workers import DeregisterReason, Heartbeat


class FakeServer:
    """Answers each request with the next scripted response and records what it received."""

    def __init__(self, *responses: httpx.Response | Exception) -> None:
        self.responses = list(responses)
        self.requests: list[httpx.Request] = []
        self.bodies: list[bytes] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.bodies.append(request.read())
        item = self.responses.pop(0) if len(self.responses) > 1 else self.responses[0]
        if isinstance(item, Exception):
            raise item
        return item


def make_client(server: FakeServer, sleeps: list[float], retries: int = 3) -> OrchestratorClient:
    return OrchestratorClient(
        "http://orch:8000/",
        token="wt",
        retries=retries,
        transport=httpx.MockTransport(server),
        sleep=sleeps.append,
    )


def test_transient_failures_are_retried_with_growing_backoff() -> None:
    reply = {"action": "continue", "checkpointer": True, "checkpoint_every_epochs": 2}
    server = FakeServer(
        httpx.Response(503, json={"detail": "db busy"}),
        httpx.ConnectError("refused"),
        httpx.Response(200, json=reply),
    )
    sleeps: list[float] = []
    answer = make_client(server, sleeps).heartbeat("w1", Heartbeat(swarm_epoch=3, loss=0.5))
    assert answer.checkpointer and answer.checkpoint_every_epochs == 2
    assert len(sleeps) == 2 and sleeps[1] > sleeps[0]
    request = server.requests[-1]
    assert request.url.path == api.heartbeat("w1")
    assert request.headers["Authorization"] == "Bearer wt"
    assert json.loads(server.bodies[-1])["swarm_epoch"] == 3


def test_unreachable_after_the_retries_are_spent() -> None:
    server = FakeServer(httpx.ConnectError("refused"))
    sleeps: list[float] = []
    with pytest.raises(Unreachable, match="refused"):
        make_client(server, sleeps, retries=2).deregister("w1", DeregisterReason.stopped)
    assert len(server.requests) == 3 and len(sleeps) == 2


@pytest.mark.parametrize(
    ("status", "error"), [(401, Unauthorized), (403, Unauthorized), (409, Conflict), (422, Rejected)]
)
def test_client_errors_raise_at_once(status: int, error: type[Exception]) -> None:
    server = FakeServer(httpx.Response(status, json={"detail": "no such join token"}))
    sleeps: list[float] = []
    with pytest.raises(error, match="no such join token"):
        make_client(server, sleeps).run_peers("demo")
    assert len(server.requests) == 1 and sleeps == []


def test_upload_streams_the_file_with_its_checksum_and_restreams_on_retry(tmp_path: Path) -> None:
    blob = tmp_path / "ckpt"
    blob.write_bytes(b"x" * 3_000_000)
    server = FakeServer(httpx.Response(503), httpx.Response(201, json={"epoch": 4}))
    sleeps: list[float] = []
    assert make_client(server, sleeps).upload_checkpoint("w1", 4, blob) == {"epoch": 4}
    last = server.requests[-1]
    assert last.method == "PUT" and last.url.path == api.checkpoint_upload("w1", 4)
    assert last.headers[CHECKSUM_HEADER] == hashlib.sha256(blob.read_bytes()).hexdigest()
    assert last.headers["Content-Length"] == "3000000"
    assert server.bodies == [blob.read_bytes(), blob.read_bytes()]


def test_download_verifies_the_checksum_and_leaves_nothing_on_mismatch(tmp_path: Path) -> None:
    payload = b"weights" * 1000
    good = hashlib.sha256(payload).hexdigest()
    server = FakeServer(httpx.Response(200, content=payload, headers={CHECKSUM_HEADER: good}))
    client = make_client(server, [])
    dest = client.download_checkpoint(api.run_latest_checkpoint("demo"), tmp_path / "a.ckpt")
    assert dest.read_bytes() == payload
    assert server.requests[-1].url.path == api.run_latest_checkpoint("demo")
    with pytest.raises(ChecksumMismatch):
        client.download_checkpoint("/runs/demo/checkpoints/latest/download", tmp_path / "b.ckpt", "0" * 64)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ckpt"]


def test_a_rate_limited_request_is_retried_after_retry_after() -> None:
    """429 (a join token's registrations past its rate) is retried, no sooner than the server says."""
    reply = {"action": "continue", "checkpointer": False, "checkpoint_every_epochs": 5}
    server = FakeServer(
        httpx.Response(429, json={"detail": "too many registrations"}, headers={"Retry-After": "7"}),
        httpx.Response(200, json=reply),
    )
    sleeps: list[float] = []
    make_client(server, sleeps).heartbeat("w1", Heartbeat())
    assert len(server.requests) == 2 and sleeps and sleeps[0] >= 7


def test_a_deregistration_sends_only_the_fields_that_differ_from_their_defaults() -> None:
    server = FakeServer(httpx.Response(204))
    make_client(server, []).deregister(
        "w1", DeregisterReason.error, "bad", unusable_spec=True, metrics={"x": 0.5}
    )
    assert json.loads(server.bodies[0]) == {
        "reason": "error",
        "message": "bad",
        "unusable_spec": True,
        "metrics": {"x": 0.5},
    }
    plain = FakeServer(httpx.Response(204))
    make_client(plain, []).deregister("w1", DeregisterReason.stopped)
    assert json.loads(plain.bodies[0]) == {"reason": "stopped"}
    other = FakeServer(httpx.Response(422, json={"detail": "message: too long"}))
    with pytest.raises(Rejected, match="too long"):
        make_client(other, []).deregister("w1", DeregisterReason.error, "x", metrics={"val_loss": 0.5})
    assert len(other.requests) == 1


@pytest.mark.parametrize(
    ("response", "ended"),
    [
        (httpx.Response(409, json={"detail": "run 'r' is failed"}), True),  # the run ended meanwhile
        (
            httpx.Response(
                409, json={"detail": "worker 7 is exited; only launching workers get a new token"}
            ),
            True,
        ),
        (httpx.Response(503, json={"detail": "db busy"}), False),  # the orchestrator, not the run
        (httpx.Response(422, json={"detail": "key too short"}), False),
    ],
)
def test_a_swarm_token_refused_because_the_run_ended_is_a_stop_not_a_failure(
    response: httpx.Response, ended: bool
) -> None:
    """A replacement still fetching its swarm token as its run fails was refused with a 409; it failed
    as if its training had (with the run's error budget counting it); it now leaves as stopped."""
    from worker.admission.authorizer import SwarmTokenUnavailable
    from worker.agent.agent import _refused_as_ended
    from worker.agent.token_cache import ClientTokenSource

    source = ClientTokenSource(lambda: make_client(FakeServer(response), [], retries=1), "7")
    with pytest.raises(SwarmTokenUnavailable) as raised:
        source("ssh-rsa " + "A" * 372)  # a key of the right shape: the request is built, then refused
    assert _refused_as_ended(raised.value) is ended
