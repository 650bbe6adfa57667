"""A checkpoint upload cut off mid-body, as a worker killed while uploading leaves it, against a real
`spotswarm serve` (a socket that hangs up): nothing is stored, no temporary file stays, the run's good
checkpoint still downloads with its recorded SHA-256 (the other attacks: tests/api/test_checkpoint_abuse.py).
"""

from __future__ import annotations

import hashlib
import os
import socket

import httpx
import pytest

from tests.support import api
from tests.support.checkpoint_files import checkpoint_bytes
from tests.support.orchestrator import HAND_ONLY, Orchestrator
from tests.support.specs import run_spec
from tests.support.waiting import wait_until
from tests.support.workers import become_checkpointer, register
from worker.protocol.paths import CHECKSUM_HEADER

MAX_BYTES = 4 << 20
ORCHESTRATOR_ENV = {**HAND_ONLY, "SPOTSWARM_CHECKPOINT_MAX_BYTES": str(MAX_BYTES)}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def upload_response(
    orch: Orchestrator, token: str, worker_id: str, epoch: int, data: bytes, checksum: str
) -> httpx.Response:
    with orch.client(token, timeout_s=60) as http:
        headers = {CHECKSUM_HEADER: checksum}
        return http.put(api.checkpoint_upload(worker_id, epoch), content=data, headers=headers)


def upload(orch: Orchestrator, token: str, worker_id: str, epoch: int, data: bytes, checksum: str) -> int:
    return upload_response(orch, token, worker_id, epoch, data, checksum).status_code


def upload_once_the_slot_is_free(
    orch: Orchestrator, token: str, worker_id: str, epoch: int, data: bytes, checksum: str
) -> int:
    """The status of an upload made once the server has seen an earlier upload hang up: until then it
    still holds that upload's slot, and answers 409 ("one at a time"), as it must."""

    def answered() -> int | None:
        response = upload_response(orch, token, worker_id, epoch, data, checksum)
        if response.status_code == 409 and "already uploading" in response.text:
            return None
        return response.status_code

    return wait_until(answered, 30, interval_s=0.2, message="the hung-up upload's slot is released")


def send_truncated(
    orch: Orchestrator, worker_id: str, token: str, epoch: int, declared: int, sent: bytes
) -> None:
    """Announce ``declared`` bytes, send ``sent`` and hang up, as a worker killed mid-upload would."""
    host, port = orch.url.removeprefix("http://").split(":")
    head = (
        f"PUT /api/v1/workers/{worker_id}/checkpoints/{epoch} HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {token}\r\n{CHECKSUM_HEADER}: {'0' * 64}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {declared}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode() + sent)


@pytest.mark.timeout(180)
def test_truncated_uploads_store_nothing(served_orch: Orchestrator) -> None:
    with served_orch.admin() as http:
        join = http.post(api.runs(), json=run_spec("truncated", keep_checkpoints=3)).json()["join_token"]
    worker = register(served_orch, join)
    worker_id, token = worker["worker_id"], worker["worker_token"]
    become_checkpointer(served_orch, worker)
    good = checkpoint_bytes(os.urandom(1 << 20))
    assert upload(served_orch, token, worker_id, 1, good, sha(good)) == 201
    blob = checkpoint_bytes(os.urandom(2 << 20))
    send_truncated(served_orch, worker_id, token, 2, len(blob), blob[: len(blob) // 3])
    # a cut file, sent once the server has seen the hang-up
    assert (
        upload_once_the_slot_is_free(served_orch, token, worker_id, 2, blob[: len(blob) // 2], sha(blob))
        == 400
    )
    # over the good one: bytes that do not match their checksum are refused before the epoch is looked at
    assert upload(served_orch, token, worker_id, 1, good[:1000], sha(good)) == 400
    tmp = served_orch.data_dir / "tmp"
    wait_until(lambda: not tmp.exists() or not any(tmp.iterdir()), 20, message="upload temp files removed")
    with served_orch.admin() as http:
        assert [c["epoch"] for c in http.get(api.run_checkpoints("truncated")).json()["items"]] == [1]
        stored = http.get(api.run_checkpoint("truncated", 1))
    assert stored.content == good and stored.headers[CHECKSUM_HEADER] == sha(good)
