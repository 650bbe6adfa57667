"""Checkpoint uploads under attack (the app in-process; a truncated upload needs a socket:
tests/integration/test_checkpoint_truncated.py): oversize, wrong checksum, wrong worker or run, a worker that
is not the checkpointer, epochs far ahead of the swarm, concurrent uploads, a nearly full disk. Each is
refused cleanly, leaves no temporary file behind, and the run's good checkpoint still downloads with its
recorded SHA-256 afterwards. Only the run's checkpointer uploads, one checkpoint at a time."""

from __future__ import annotations

import hashlib
import itertools
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support import api
from tests.support.checkpoint_files import checkpoint_bytes
from tests.support.inprocess import InProcessOrchestrator as Orchestrator
from tests.support.inprocess import inprocess_orchestrator
from tests.support.orchestrator import HAND_ONLY
from tests.support.specs import run_spec
from tests.support.waiting import wait_until
from tests.support.workers import become_checkpointer, heartbeat
from worker.protocol.paths import CHECKSUM_HEADER

MAX_BYTES = 4 << 20
EVERY = 20  # checkpoint_every_epochs: with no swarm epoch read from a DHT here, uploads go up to epoch 20
ORCHESTRATOR_ENV = {**HAND_ONLY, "SPOTSWARM_CHECKPOINT_MAX_BYTES": str(MAX_BYTES)}
_runs = itertools.count()


@dataclass
class Worker:
    id: str
    token: str

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def reply(self) -> dict[str, str]:
        """As a registration reply (for the worker_support helpers)."""
        return {"worker_id": self.id, "worker_token": self.token}


@dataclass
class Run:
    """A run with two workers and one good checkpoint (epoch 1, uploaded by ``a``, its checkpointer)."""

    api_app: Orchestrator
    name: str
    join: str
    a: Worker
    b: Worker
    good: bytes

    def download(self, epoch: int | str) -> tuple[bytes, str]:
        with self.api_app.admin() as http:
            response = http.get(api.run_checkpoint(self.name, epoch))
        response.raise_for_status()
        return response.content, response.headers[CHECKSUM_HEADER]

    def epochs(self) -> list[int]:
        with self.api_app.admin() as http:
            items = http.get(api.run_checkpoints(self.name)).json()["items"]
        return [item["epoch"] for item in items]

    def checkpointer_is_a(self) -> None:
        """``a`` heartbeats until it holds the role (it is older than ``b``, which never heartbeats)."""
        become_checkpointer(self.api_app, self.a.reply())

    def assert_good_intact(self) -> None:
        """The good checkpoint downloads whole, with the checksum recorded for it and no other one."""
        data, recorded = self.download(1)
        assert data == self.good and recorded == sha(self.good)
        data, recorded = self.download("latest")
        assert hashlib.sha256(data).hexdigest() == recorded


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def register(api_app: Orchestrator, join: str) -> Worker:
    with api_app.client(join) as http:
        reply = http.post(api.register(), json={"hostname": "abuse"}).json()
    return Worker(reply["worker_id"], reply["worker_token"])


def upload(
    api_app: Orchestrator,
    worker: Worker,
    epoch: int,
    data: bytes,
    checksum: str | None = None,
    **headers: str,
) -> httpx.Response:
    sent = {**worker.auth(), CHECKSUM_HEADER: checksum if checksum is not None else sha(data), **headers}
    with api_app.client(timeout_s=60) as http:
        return http.put(api.checkpoint_upload(worker.id, epoch), content=data, headers=sent)


@pytest.fixture
def run(api_app: Orchestrator) -> Run:
    name = f"abuse-{next(_runs)}"
    with api_app.admin() as http:
        spec = run_spec(name, keep_checkpoints=3, checkpoint_every_epochs=EVERY)
        join = http.post(api.runs(), json=spec).json()["join_token"]
    good = checkpoint_bytes(os.urandom(1 << 20))
    created = Run(api_app, name, join, register(api_app, join), register(api_app, join), good)
    created.checkpointer_is_a()
    assert upload(api_app, created.a, 1, good).status_code == 201
    return created


def no_temporary_files(api_app: Orchestrator) -> bool:
    tmp = api_app.data_dir / "tmp"
    return not tmp.exists() or not any(tmp.iterdir())


def assert_clean(run: Run, expected_epochs: list[int]) -> None:
    wait_until(lambda: no_temporary_files(run.api_app), 20, message="upload temp files removed")
    assert run.epochs() == expected_epochs
    run.assert_good_intact()


@pytest.mark.timeout(120)
def test_oversize_uploads_are_413_declared_or_streamed(api_app: Orchestrator, run: Run) -> None:
    run.checkpointer_is_a()
    big = os.urandom(MAX_BYTES + 1)
    assert upload(api_app, run.a, 2, big).status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: the server counts while it reads
        for start in range(0, len(big), 1 << 20):
            yield big[start : start + (1 << 20)]

    headers = {**run.a.auth(), CHECKSUM_HEADER: sha(big)}
    with api_app.client(timeout_s=60) as http:
        try:
            answer = http.put(api.checkpoint_upload(run.a.id, 3), content=chunks(), headers=headers)
            assert answer.status_code == 413, answer.text
        except (httpx.RemoteProtocolError, httpx.WriteError):
            pass  # the server answered 413 and closed while the client was still sending: also a refusal
    assert_clean(run, [1])


@pytest.mark.timeout(120)
def test_bad_checksums_are_refused(api_app: Orchestrator, run: Run) -> None:
    run.checkpointer_is_a()
    blob = checkpoint_bytes(os.urandom(100_000))
    assert upload(api_app, run.a, 2, blob, checksum=sha(blob[1:])).status_code == 400
    assert upload(api_app, run.a, 2, blob, checksum="not-hex").status_code == 422
    assert upload(api_app, run.a, 2, blob, checksum="").status_code == 422
    assert upload(api_app, run.a, 1, blob).status_code == 409  # the good epoch, other bytes
    again = upload(api_app, run.a, 1, run.good)  # the same bytes again: a retry, answered with the stored one
    assert again.status_code == 201 and again.json()["sha256"] == sha(run.good)
    assert_clean(run, [1])


@pytest.mark.timeout(120)
def test_other_workers_runs_and_tokens_cannot_upload(api_app: Orchestrator, run: Run) -> None:
    with api_app.admin() as http:
        other_join = http.post(api.runs(), json=run_spec(f"{run.name}-other")).json()["join_token"]
    stranger = register(api_app, other_join)
    blob = checkpoint_bytes(os.urandom(50_000))
    path = api.checkpoint_upload(run.a.id, 1)
    attempts = {
        "another run's worker": stranger.token,
        "the same run's other worker": run.b.token,
        "the run's join token": run.join,
        "the admin token": api_app.admin_token,
        "a made-up worker token": "ssw_" + "A" * 43,
    }
    with api_app.client() as http:
        for what, token in attempts.items():
            headers = {"Authorization": f"Bearer {token}", CHECKSUM_HEADER: sha(blob)}
            answer = http.put(path, content=blob, headers=headers)
            assert answer.status_code == 403, (what, answer.status_code, answer.text)
        answer = http.put(path, content=blob, headers={CHECKSUM_HEADER: sha(blob)})
        assert answer.status_code == 401
    # The stranger's own upload lands in its own run (where it is the checkpointer), never in this one.
    become_checkpointer(api_app, stranger.reply())
    assert upload(api_app, stranger, 1, blob).status_code == 201
    with api_app.client(run.b.token) as http:
        assert http.post(api.deregister(run.b.id), json={"reason": "stopped"}).status_code == 204
    assert upload(api_app, run.b, 2, blob).status_code == 409  # an ended worker uploads nothing
    assert_clean(run, [1])


@pytest.mark.timeout(180)
def test_two_workers_racing_for_one_epoch_store_only_the_checkpointers_bytes(
    api_app: Orchestrator, run: Run
) -> None:
    """Both workers send different bytes for the same epoch at once: the checkpointer's are stored, the
    other worker gets 409 whichever arrives first (before, either could win, or both be mixed up)."""
    for epoch in range(2, 8):
        run.checkpointer_is_a()
        blobs = {
            run.a.id: checkpoint_bytes(os.urandom(3 << 20)),
            run.b.id: checkpoint_bytes(os.urandom(3 << 20)),
        }
        barrier = threading.Barrier(2)

        def race(
            worker: Worker,
            blobs: dict[str, bytes] = blobs,
            epoch: int = epoch,
            barrier: threading.Barrier = barrier,
        ) -> int:
            barrier.wait()
            return upload(api_app, worker, epoch, blobs[worker.id]).status_code

        with ThreadPoolExecutor(2) as pool:
            codes = dict(zip((run.a.id, run.b.id), pool.map(race, (run.a, run.b)), strict=True))
        assert codes == {run.a.id: 201, run.b.id: 409}, codes
        data, recorded = run.download(epoch)
        assert data == blobs[run.a.id] and recorded == sha(data), f"epoch {epoch}: stored bytes damaged"
    assert_clean_kept(run, [7, 6, 5])


def assert_clean_kept(run: Run, expected: list[int]) -> None:
    """Only the kept checkpoints remain, each whole; the store holds no other checkpoint file."""
    wait_until(lambda: no_temporary_files(run.api_app), 20, message="upload temp files removed")
    assert run.epochs() == expected
    for epoch in expected:
        data, recorded = run.download(epoch)
        assert sha(data) == recorded
    with run.api_app.admin() as http:
        swarm_id = http.get(api.run(run.name)).json()["swarm_id"]
    files = list((run.api_app.data_dir / "checkpoints" / "runs" / swarm_id).iterdir())
    wait_until(
        lambda: (
            len(list((run.api_app.data_dir / "checkpoints" / "runs" / swarm_id).iterdir())) == len(expected)
        ),
        20,
        message=f"pruned files deleted: {sorted(p.name for p in files)}",
    )


@pytest.mark.timeout(180)
def test_uploads_of_successive_epochs_are_recorded_then_pruned(api_app: Orchestrator, run: Run) -> None:
    blobs = {epoch: checkpoint_bytes(os.urandom(1 << 20)) for epoch in range(10, 16)}
    for epoch, blob in blobs.items():
        run.checkpointer_is_a()
        assert upload(api_app, run.a, epoch, blob).status_code == 201
    assert_clean_kept(run, [15, 14, 13])
    for epoch in (15, 14, 13):
        assert run.download(epoch)[0] == blobs[epoch]


@pytest.mark.timeout(120)
def test_only_the_checkpointer_uploads(api_app: Orchestrator, run: Run) -> None:
    """Before, any worker of the run could upload: its checkpoints then pruned the real ones."""
    heartbeat(api_app, run.b.reply())
    answer = upload(api_app, run.b, 2, checkpoint_bytes(os.urandom(10_000)))
    assert answer.status_code == 409 and "not the run's checkpointer" in answer.json()["detail"], answer.text
    assert_clean(run, [1])


@pytest.mark.timeout(120)
def test_uploads_far_ahead_of_the_swarm_are_refused(api_app: Orchestrator, run: Run) -> None:
    """Before, three tiny uploads at epochs near 10^12 pruned every real checkpoint, and the heartbeat
    replies' latest_checkpoint_epoch of 10^12 kept the real checkpointer from ever uploading again."""
    run.checkpointer_is_a()
    for epoch in (10**12, 10**12 - 1, 10**12 - 2, EVERY + 1):
        answer = upload(api_app, run.a, epoch, f"junk {epoch}".encode())
        assert answer.status_code == 409 and "ahead of the swarm" in answer.json()["detail"], answer.text
    assert_clean(run, [1])
    assert heartbeat(api_app, run.a.reply())["latest_checkpoint_epoch"] == 1


@pytest.mark.timeout(120)
def test_a_worker_uploads_one_checkpoint_at_a_time(api_app: Orchestrator, run: Run) -> None:
    """Before, one worker could stream any number of uploads at once into the orchestrator's disk."""
    run.checkpointer_is_a()
    first_blob = checkpoint_bytes(os.urandom(2 << 20))
    release = threading.Event()

    def slow() -> Iterator[bytes]:
        yield first_blob[: 1 << 20]
        release.wait(60)
        yield first_blob[1 << 20 :]

    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(lambda: upload_stream(api_app, run.a, 2, slow(), sha(first_blob)).status_code)
        tmp = api_app.data_dir / "tmp"
        wait_until(lambda: tmp.exists() and any(tmp.iterdir()), 30, message="the first upload streams")
        second = upload(api_app, run.a, 3, checkpoint_bytes(os.urandom(10_000)))
        release.set()
        assert second.status_code == 409 and "already uploading" in second.json()["detail"], second.text
        assert first.result(timeout=60) == 201
    assert_clean(run, [2, 1])
    assert (
        upload(api_app, run.a, 3, checkpoint_bytes(b"next one")).status_code == 201
    )  # the next upload goes through


def upload_stream(
    api_app: Orchestrator, worker: Worker, epoch: int, chunks: Iterator[bytes], checksum: str
) -> httpx.Response:
    headers = {**worker.auth(), CHECKSUM_HEADER: checksum}
    with api_app.client(timeout_s=90) as http:
        return http.put(api.checkpoint_upload(worker.id, epoch), content=chunks, headers=headers)


@pytest.mark.timeout(120)
def test_the_checkpointer_of_a_stopping_run_still_uploads_its_final_checkpoint(
    api_app: Orchestrator, run: Run
) -> None:
    """The worker that held the role when the stop began keeps it until it leaves, and the reply that
    tells it to stop says so (its agent then saves a final checkpoint); no other worker takes the role
    over while the run stops."""
    run.checkpointer_is_a()
    heartbeat(api_app, run.b.reply())
    with api_app.admin() as http:
        assert http.post(api.run_stop(run.name)).json()["state"] == "stopping"
    told_a, told_b = heartbeat(api_app, run.a.reply()), heartbeat(api_app, run.b.reply())
    assert (told_a["action"], told_a["checkpointer"]) == ("stop", True), told_a
    assert (told_b["action"], told_b["checkpointer"]) == ("stop", False), told_b
    final = checkpoint_bytes(os.urandom(50_000))
    assert upload(api_app, run.b, 3, checkpoint_bytes(os.urandom(10_000))).status_code == 409
    assert upload(api_app, run.a, 3, final).status_code == 201
    assert run.download("latest")[0] == final


@pytest.mark.timeout(180)
def test_uploads_are_refused_while_the_disk_is_nearly_full(tmp_path: Path) -> None:
    """Free space is checked before the body is read: 507, nothing written (the reserve here is larger
    than any disk, so the real free space of the temp dir is always short of it)."""
    env = {**ORCHESTRATOR_ENV, "SPOTSWARM_CHECKPOINT_MIN_FREE_BYTES": str(10**18)}
    with inprocess_orchestrator(tmp_path / "data", env=env) as api_app:
        _refused_while_the_disk_is_nearly_full(api_app)


def _refused_while_the_disk_is_nearly_full(api_app: Orchestrator) -> None:
    with api_app.admin() as http:
        join = http.post(api.runs(), json=run_spec("full-disk")).json()["join_token"]
    worker = register(api_app, join)
    become_checkpointer(api_app, worker.reply())
    answer = upload(api_app, worker, 1, checkpoint_bytes(os.urandom(100_000)))
    assert answer.status_code == 507 and "free" in answer.json()["detail"], answer.text
    assert no_temporary_files(api_app)
    with api_app.admin() as http:
        assert http.get(api.run_checkpoints("full-disk")).json()["items"] == []
