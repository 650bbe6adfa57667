"""Checkpoint uploads under attack: truncated, oversize, wrong checksum, wrong worker or run, and concurrent
uploads of the same and of different epochs. Each is refused cleanly (or serialized), leaves no temporary
file behind, and the run's good checkpoint still downloads with its recorded SHA-256 afterwards."""

from __future__ import annotations

import hashlib
import itertools
import os
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

from tests.helpers import ProcessRegistry, wait_until
from tests.orchestrator_fixture import NO_RECONCILE, Orchestrator, run_spec, start_orchestrator
from worker.wire import CHECKSUM_HEADER

MAX_BYTES = 4 << 20
_runs = itertools.count()


@pytest.fixture(scope="module")
def orch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Orchestrator]:
    root = tmp_path_factory.mktemp("ckpt-abuse")
    registry = ProcessRegistry(root)
    env = {
        **NO_RECONCILE,
        "SPOTSWARM_CHECK_IMPORTS": "false",
        "SPOTSWARM_CHECKPOINT_MAX_BYTES": str(MAX_BYTES),
    }
    try:
        yield start_orchestrator(registry, root / "data", extra_env=env)
    finally:
        registry.kill_all()


@dataclass
class Worker:
    id: str
    token: str

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@dataclass
class Run:
    """A run with two workers and one good checkpoint (epoch 1, uploaded by ``a``)."""

    orch: Orchestrator
    name: str
    join: str
    a: Worker
    b: Worker
    good: bytes

    def download(self, epoch: int | str) -> tuple[bytes, str]:
        with self.orch.admin() as http:
            response = http.get(f"/api/v1/runs/{self.name}/checkpoints/{epoch}/download")
        response.raise_for_status()
        return response.content, response.headers[CHECKSUM_HEADER]

    def epochs(self) -> list[int]:
        with self.orch.admin() as http:
            items = http.get(f"/api/v1/runs/{self.name}/checkpoints").json()["items"]
        return [item["epoch"] for item in items]

    def assert_good_intact(self) -> None:
        """The good checkpoint downloads whole, with the checksum recorded for it and no other one."""
        data, recorded = self.download(1)
        assert data == self.good and recorded == sha(self.good)
        data, recorded = self.download("latest")
        assert hashlib.sha256(data).hexdigest() == recorded


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def register(orch: Orchestrator, join: str) -> Worker:
    with orch.client(join) as http:
        reply = http.post("/api/v1/workers/register", json={"hostname": "abuse"}).json()
    return Worker(reply["worker_id"], reply["worker_token"])


def upload(
    orch: Orchestrator, worker: Worker, epoch: int, data: bytes, checksum: str | None = None, **headers: str
) -> httpx.Response:
    sent = {**worker.auth(), CHECKSUM_HEADER: checksum if checksum is not None else sha(data), **headers}
    with orch.client(timeout_s=60) as http:
        return http.put(f"/api/v1/workers/{worker.id}/checkpoints/{epoch}", content=data, headers=sent)


@pytest.fixture
def run(orch: Orchestrator) -> Run:
    name = f"abuse-{next(_runs)}"
    with orch.admin() as http:
        join = http.post("/api/v1/runs", json=run_spec(name, keep_checkpoints=3)).json()["join_token"]
    good = os.urandom(1 << 20)
    created = Run(orch, name, join, register(orch, join), register(orch, join), good)
    assert upload(orch, created.a, 1, good).status_code == 201
    return created


def no_temporary_files(orch: Orchestrator) -> bool:
    tmp = orch.data_dir / "tmp"
    return not tmp.exists() or not any(tmp.iterdir())


def assert_clean(run: Run, expected_epochs: list[int]) -> None:
    wait_until(lambda: no_temporary_files(run.orch), 20, message="upload temp files removed")
    assert run.epochs() == expected_epochs
    run.assert_good_intact()


def send_truncated(orch: Orchestrator, worker: Worker, epoch: int, declared: int, sent: bytes) -> None:
    """Announce ``declared`` bytes, send ``sent`` and hang up, as a worker killed mid-upload would."""
    host, port = orch.url.removeprefix("http://").split(":")
    head = (
        f"PUT /api/v1/workers/{worker.id}/checkpoints/{epoch} HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {worker.token}\r\n{CHECKSUM_HEADER}: {'0' * 64}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {declared}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode() + sent)


@pytest.mark.timeout(180)
def test_truncated_uploads_store_nothing(orch: Orchestrator, run: Run) -> None:
    blob = os.urandom(2 << 20)
    send_truncated(orch, run.a, 2, len(blob), blob[: len(blob) // 3])
    answer = upload(orch, run.a, 2, blob[: len(blob) // 2], checksum=sha(blob))  # a cut file, honest length
    assert answer.status_code == 400 and "sha256" in answer.json()["detail"]
    answer = upload(orch, run.a, 1, run.good[:1000], checksum=sha(run.good))  # over the good one
    assert answer.status_code in (400, 409)
    assert_clean(run, [1])


@pytest.mark.timeout(180)
def test_oversize_uploads_are_413_declared_or_streamed(orch: Orchestrator, run: Run) -> None:
    big = os.urandom(MAX_BYTES + 1)
    assert upload(orch, run.a, 2, big).status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: the server counts while it reads
        for start in range(0, len(big), 1 << 20):
            yield big[start : start + (1 << 20)]

    headers = {**run.a.auth(), CHECKSUM_HEADER: sha(big)}
    with orch.client(timeout_s=60) as http:
        try:
            answer = http.put(f"/api/v1/workers/{run.a.id}/checkpoints/3", content=chunks(), headers=headers)
            assert answer.status_code == 413, answer.text
        except (httpx.RemoteProtocolError, httpx.WriteError):
            pass  # the server answered 413 and closed while the client was still sending: also a refusal
    assert_clean(run, [1])


@pytest.mark.timeout(180)
def test_bad_checksums_are_refused(orch: Orchestrator, run: Run) -> None:
    blob = os.urandom(100_000)
    assert upload(orch, run.a, 2, blob, checksum=sha(blob[1:])).status_code == 400
    assert upload(orch, run.a, 2, blob, checksum="not-hex").status_code == 422
    assert upload(orch, run.a, 2, blob, checksum="").status_code == 422
    assert upload(orch, run.a, 1, blob).status_code == 409  # the good epoch, other bytes
    again = upload(orch, run.a, 1, run.good)  # the same bytes again: a retry, answered with the stored one
    assert again.status_code == 201 and again.json()["sha256"] == sha(run.good)
    assert_clean(run, [1])


@pytest.mark.timeout(180)
def test_other_workers_runs_and_tokens_cannot_upload(orch: Orchestrator, run: Run) -> None:
    with orch.admin() as http:
        other_join = http.post("/api/v1/runs", json=run_spec(f"{run.name}-other")).json()["join_token"]
    stranger = register(orch, other_join)
    blob = os.urandom(50_000)
    path = f"/api/v1/workers/{run.a.id}/checkpoints/1"
    attempts = {
        "another run's worker": stranger.token,
        "the same run's other worker": run.b.token,
        "the run's join token": run.join,
        "the admin token": orch.admin_token,
        "a made-up worker token": "ssw_" + "A" * 43,
    }
    with orch.client() as http:
        for what, token in attempts.items():
            headers = {"Authorization": f"Bearer {token}", CHECKSUM_HEADER: sha(blob)}
            answer = http.put(path, content=blob, headers=headers)
            assert answer.status_code == 403, (what, answer.status_code, answer.text)
        answer = http.put(path, content=blob, headers={CHECKSUM_HEADER: sha(blob)})
        assert answer.status_code == 401
    # The stranger's own upload lands in its own run, never in this one.
    assert upload(orch, stranger, 1, blob).status_code == 201
    with orch.client(run.b.token) as http:
        assert (
            http.post(f"/api/v1/workers/{run.b.id}/deregister", json={"reason": "stopped"}).status_code == 204
        )
    assert upload(orch, run.b, 2, blob).status_code == 409  # an ended worker uploads nothing
    assert_clean(run, [1])


@pytest.mark.timeout(240)
def test_concurrent_uploads_of_one_epoch_keep_one_whole_checkpoint(orch: Orchestrator, run: Run) -> None:
    """Two workers race with different bytes for the same epoch: one wins, the other gets 409, and the
    stored file is the winner's (before the fix the loser's bytes could overwrite the winner's file)."""
    for epoch in range(2, 8):
        blobs = {run.a.id: os.urandom(3 << 20), run.b.id: os.urandom(3 << 20)}
        barrier = threading.Barrier(2)

        def race(
            worker: Worker,
            blobs: dict[str, bytes] = blobs,
            epoch: int = epoch,
            barrier: threading.Barrier = barrier,
        ) -> int:
            barrier.wait()
            return upload(orch, worker, epoch, blobs[worker.id]).status_code

        with ThreadPoolExecutor(2) as pool:
            codes = dict(zip((run.a.id, run.b.id), pool.map(race, (run.a, run.b)), strict=True))
        assert sorted(codes.values()) == [201, 409], codes
        winner = next(worker_id for worker_id, code in codes.items() if code == 201)
        data, recorded = run.download(epoch)
        assert data == blobs[winner] and recorded == sha(data), f"epoch {epoch}: stored bytes damaged"
    assert_clean_kept(run, [7, 6, 5])


def assert_clean_kept(run: Run, expected: list[int]) -> None:
    """Only the kept checkpoints remain, each whole; the store holds no other checkpoint file."""
    wait_until(lambda: no_temporary_files(run.orch), 20, message="upload temp files removed")
    assert run.epochs() == expected
    for epoch in expected:
        data, recorded = run.download(epoch)
        assert sha(data) == recorded
    with run.orch.admin() as http:
        swarm_id = http.get(f"/api/v1/runs/{run.name}").json()["swarm_id"]
    files = list((run.orch.data_dir / "checkpoints" / "runs" / swarm_id).iterdir())
    wait_until(
        lambda: len(list((run.orch.data_dir / "checkpoints" / "runs" / swarm_id).iterdir())) == len(expected),
        20,
        message=f"pruned files deleted: {sorted(p.name for p in files)}",
    )


@pytest.mark.timeout(240)
def test_concurrent_uploads_of_different_epochs_are_all_recorded_then_pruned(
    orch: Orchestrator, run: Run
) -> None:
    blobs = {epoch: os.urandom(1 << 20) for epoch in range(10, 16)}
    workers = itertools.cycle([run.a, run.b])
    jobs = [(next(workers), epoch) for epoch in blobs]
    with ThreadPoolExecutor(len(jobs)) as pool:
        codes = list(pool.map(lambda job: upload(orch, job[0], job[1], blobs[job[1]]).status_code, jobs))
    assert codes == [201] * len(jobs)
    assert_clean_kept(run, [15, 14, 13])
    for epoch in (15, 14, 13):
        assert run.download(epoch)[0] == blobs[epoch]
