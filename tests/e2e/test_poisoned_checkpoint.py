"""A join token cannot fail a run through its checkpoint (security review N1). Real `spotswarm serve` with
the reconcile loop, a worker joined by hand over HTTP with the run's join token, and a launched local
worker training the digits example from the run's checkpoint.

Before: the hand-joined worker was elected checkpointer after one heartbeat, its junk upload became the
run's latest checkpoint, and each launched worker resumed from it, failed in ``trainer.fit`` and counted
as a start-up failure until the run failed.
"""

from __future__ import annotations

import hashlib
from typing import Any

import httpx
import pytest

from tests.support import api
from tests.support.checkpoint_files import checkpoint_bytes
from tests.support.orchestrator import Orchestrator
from tests.support.runs import RunReader, admin_post, digits_run
from tests.support.waiting import BOOT_S, wait_until
from tests.support.workers import become_checkpointer, heartbeat, register, wait_ticks
from worker.protocol.paths import CHECKSUM_HEADER

pytestmark = [pytest.mark.swarm]


def upload(orch: Orchestrator, worker: dict[str, Any], epoch: int, data: bytes) -> httpx.Response:
    with orch.client(worker["worker_token"]) as http:
        headers = {CHECKSUM_HEADER: hashlib.sha256(data).hexdigest()}
        return http.put(api.checkpoint_upload(worker["worker_id"], epoch), content=data, headers=headers)


def create(orch: Orchestrator, name: str, **overrides: Any) -> str:
    """Create a digits run with no worker launched yet; its join token."""
    spec = digits_run(name, desired_workers=0, min_workers=0, **overrides)
    return str(admin_post(orch, api.runs(), spec).json()["join_token"])


def launched_worker_trains(orch: Orchestrator, reader: RunReader) -> dict[str, Any]:
    """Scale the run to one launched worker and wait until it trains; that worker's row."""
    admin_post(orch, api.run_scale(reader.name), {"desired_workers": 1})

    def training() -> dict[str, Any] | None:
        workers = reader.workers()
        failed = [w for w in workers if w["state"] == "failed"]
        if failed:  # at once: waiting on would only see its replacements fail the same way
            pytest.fail(f"a launched worker failed: {failed[0]['exit_reason']}")
        return next((w for w in workers if not w["manual"] and w["samples"] > 0), None)

    worker = wait_until(training, BOOT_S + 60, interval_s=1, message="the launched worker trains")
    assert worker is not None
    return worker


@pytest.mark.timeout(360)
def test_a_join_token_holder_cannot_make_launched_workers_resume_from_junk(loop_orch: Orchestrator) -> None:
    orch = loop_orch
    join = create(orch, "poison-default", hand_joined_checkpoint=False)  # the default, said out loud
    hand = register(orch, join)
    heartbeat(orch, hand)
    wait_ticks(orch, 2)  # the elections it would have won
    heartbeat(orch, hand)
    answer = upload(orch, hand, 1, b"junk")
    assert answer.status_code in (409, 422), answer.text  # not the checkpointer; and junk is no checkpoint
    reader = RunReader(orch, "poison-default")
    assert reader.checkpoints() == []
    launched_worker_trains(orch, reader)
    assert reader.run()["state"] == "running"


@pytest.mark.timeout(360)
def test_a_checkpoint_that_does_not_load_is_skipped_reported_and_no_start_failure(
    loop_orch: Orchestrator,
) -> None:
    """An opted-in hand-joined checkpointer uploads a well-formed checkpoint of another model: the server
    stores it (its format is right), and the launched worker falls back to no checkpoint instead of
    failing."""
    orch = loop_orch
    join = create(orch, "poison-opted-in", hand_joined_checkpoint=True)
    hand = register(orch, join)
    become_checkpointer(orch, hand)
    foreign = checkpoint_bytes(state_dict={"encoder.weight": 0})
    assert upload(orch, hand, 1, foreign).status_code == 201
    with orch.client(hand["worker_token"]) as http:  # the hand-joined worker leaves
        http.post(api.deregister(hand["worker_id"]), json={"reason": "stopped"})
    reader = RunReader(orch, "poison-opted-in")
    worker = launched_worker_trains(orch, reader)
    unloadable = [e["message"] for e in reader.events() if e["kind"] == "checkpoint.unloadable"]
    expected = (
        f"worker {worker['id']} could not resume from the checkpoint of epoch 1, uploaded by worker "
        f"{hand['worker_id']}: its state_dict does not fit the module: missing "
        "['net.0.bias', 'net.0.weight', 'net.2.bias'], unexpected ['encoder.weight']"
    )
    assert unloadable == [expected], unloadable
    run = reader.run()
    assert run["state"] == "running", run["state_reason"]
