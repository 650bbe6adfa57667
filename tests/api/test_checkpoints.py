"""Checkpoints: uploads by the run's checkpointer (checksum, size cap, keep-last-k), listing and downloads
with the run's tokens. The app in-process, on SQLite and on PostgreSQL."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.api.conftest import BOTH_BACKENDS
from tests.support import api
from tests.support.checkpoint_files import checkpoint_bytes
from tests.support.inprocess import InProcessOrchestrator as Orchestrator
from tests.support.orchestrator import HAND_ONLY
from tests.support.specs import create_run
from tests.support.workers import become_checkpointer, heartbeat, register
from worker.protocol.paths import CHECKSUM_HEADER

pytestmark = pytest.mark.parametrize("backend", BOTH_BACKENDS, indirect=True)
CHECKPOINT_MAX_BYTES = 256 * 1024
ORCHESTRATOR_ENV = {**HAND_ONLY, "SPOTSWARM_CHECKPOINT_MAX_BYTES": str(CHECKPOINT_MAX_BYTES)}


def create(api_app: Orchestrator, **overrides: Any) -> tuple[str, str]:
    return create_run(api_app, "w", **overrides)


def upload(
    api_app: Orchestrator, worker: dict[str, Any], epoch: int, data: bytes, checksum: str | None = None
) -> Any:
    headers = {CHECKSUM_HEADER: checksum or hashlib.sha256(data).hexdigest()}
    with api_app.client(worker["worker_token"]) as http:
        return http.put(api.checkpoint_upload(worker["worker_id"], epoch), content=data, headers=headers)


@pytest.mark.timeout(60)
def test_checkpoints_upload_verify_keep_last_k_and_download(api_app: Orchestrator) -> None:
    name, join = create(api_app, keep_checkpoints=2)
    worker = register(api_app, join)
    become_checkpointer(api_app, worker)  # only the checkpointer uploads
    blobs = {epoch: checkpoint_bytes(bytes([epoch]) * (50_000 + epoch)) for epoch in (1, 2, 3)}
    for epoch, data in blobs.items():
        response = upload(api_app, worker, epoch, data)
        assert response.status_code == 201, response.text
        assert response.json()["sha256"] == hashlib.sha256(data).hexdigest()
    assert upload(api_app, worker, 3, blobs[3]).status_code == 201  # a retried upload is accepted
    assert upload(api_app, worker, 3, blobs[2]).status_code == 409  # other bytes for a stored epoch
    with api_app.client() as http:
        listed = http.get(api.run_checkpoints(name)).json()["items"]
        assert http.get(api.run_latest_checkpoint(name)).status_code == 401
        events = http.get(api.run_events(name), params={"limit": 100}).json()["items"]
    # sizes as the page and the CLI write them (it said "epoch 1, 0.0 MiB")
    stored_events = [e["message"] for e in events if e["kind"] == "checkpoint.stored"]
    assert f"epoch 1, {len(blobs[1]) / 1024:.1f} KiB" in stored_events, stored_events
    assert [c["epoch"] for c in listed] == [3, 2]
    assert heartbeat(api_app, worker)["latest_checkpoint_epoch"] == 3
    with api_app.client(join) as http:
        latest = http.get(api.run_latest_checkpoint(name))
        assert http.get(api.run_checkpoint(name, 1)).status_code == 404
    with api_app.client(worker["worker_token"]) as http:
        second = http.get(listed[1]["download_path"])
    assert latest.content == blobs[3] and latest.headers[CHECKSUM_HEADER] == listed[0]["sha256"]
    assert second.content == blobs[2]
    stored = sorted(p.name for p in (api_app.data_dir / "checkpoints").rglob("*.ckpt"))
    files = {e: f"epoch-{e:08d}-{hashlib.sha256(data).hexdigest()}.ckpt" for e, data in blobs.items()}
    assert len([s for s in stored if s in (files[2], files[3])]) == 2
    assert files[1] not in stored
    assert register(api_app, join)["resume_checkpoint"]["epoch"] == 3


@pytest.mark.timeout(60)
def test_checkpoint_uploads_are_checked(api_app: Orchestrator) -> None:
    name, join = create(api_app)
    worker = register(api_app, join)
    become_checkpointer(api_app, worker)
    assert upload(api_app, worker, 1, b"abc", checksum="0" * 64).status_code == 400
    assert upload(api_app, worker, 1, b"abc", checksum="not-hex").status_code == 422
    assert upload(api_app, worker, 1, b"x" * (CHECKPOINT_MAX_BYTES + 1)).status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: the cap applies while streaming
        for _ in range(5):
            yield b"y" * (CHECKPOINT_MAX_BYTES // 4)

    with api_app.client(worker["worker_token"]) as http:
        response = http.put(
            api.checkpoint_upload(worker["worker_id"], 1),
            content=chunks(),
            headers={CHECKSUM_HEADER: "a" * 64},
        )
    assert response.status_code == 413
    _, other_join = create(api_app)
    with api_app.client(other_join) as http:
        assert http.get(api.run_latest_checkpoint(name)).status_code == 403
    with api_app.client() as http:
        assert http.get(api.run_checkpoints(name)).json()["items"] == []
    assert not list((api_app.data_dir / "tmp").glob("*"))  # temporary files are cleaned up
