"""What a run trusts its hand-joined workers with (workers registered with its join token): the
checkpointer role only by the run's opt-in and only while no launched worker can hold it, the
``secret_env`` values unless the run keeps them; and what any checkpointer may store: only bytes that are
a torch-saved checkpoint (security review N1, N6; the attack with real workers:
tests/e2e/test_poisoned_checkpoint.py)."""

from __future__ import annotations

import hashlib
from typing import Any

import httpx
import pytest

from tests.support import api
from tests.support.checkpoint_files import checkpoint_bytes
from tests.support.inprocess import InProcessOrchestrator as Orchestrator
from tests.support.operability import launch_intent
from tests.support.specs import create_run
from tests.support.waiting import wait_until
from tests.support.workers import become_checkpointer, heartbeat, register
from worker.protocol.paths import CHECKSUM_HEADER
from worker.protocol.runs import SERVER_ONLY_SPEC_FIELDS

pytestmark = pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
SECRET = "sk-TRUST-only-launched-123456"


def upload(api_app: Orchestrator, worker: dict[str, Any], epoch: int, data: bytes) -> httpx.Response:
    with api_app.client(worker["worker_token"]) as http:
        headers = {CHECKSUM_HEADER: hashlib.sha256(data).hexdigest()}
        return http.put(api.checkpoint_upload(worker["worker_id"], epoch), content=data, headers=headers)


def checkpointer_events(api_app: Orchestrator, name: str) -> list[str]:
    with api_app.client() as http:
        events = http.get(api.run_events(name)).json()["items"]
    return [e["message"] for e in events if e["kind"] == "run.checkpointer"]


def launched(api_app: Orchestrator, name: str) -> dict[str, Any]:
    """A launched worker of the run: the launch row the reconcile loop writes, registered by its agent."""
    request_id, launch_token = launch_intent(api_app, name)
    return register(api_app, launch_token, request_id=request_id)


@pytest.mark.timeout(120)
def test_a_hand_joined_worker_never_checkpoints_a_run_that_did_not_opt_in(api_app: Orchestrator) -> None:
    """Before, the first hand-joined worker of a run became its checkpointer after one heartbeat and could
    upload the checkpoint every launched worker then resumed from."""
    name, join = create_run(api_app, "trust", hand_joined_checkpoint=False)
    hand = register(api_app, join)
    heartbeat(api_app, hand)
    # a control: the flush that elects an opted-in run's hand-joined worker has written the beat above
    _, control_join = create_run(api_app, "trust", hand_joined_checkpoint=True)
    become_checkpointer(api_app, register(api_app, control_join))
    assert checkpointer_events(api_app, name) == []
    worker = launched(api_app, name)
    wait_until(  # the hand-joined one keeps beating, registered first: before, it was chosen and stayed
        lambda: heartbeat(api_app, hand) and heartbeat(api_app, worker)["checkpointer"],
        30,
        message="the launched worker checkpoints the run",
    )
    assert checkpointer_events(api_app, name) == [f"worker {worker['worker_id']} checkpoints the run"]
    answer = upload(api_app, hand, 1, checkpoint_bytes(b"poison"))
    assert answer.status_code == 409 and "not the run's checkpointer" in answer.json()["detail"], answer.text
    assert upload(api_app, worker, 1, checkpoint_bytes(b"real")).status_code == 201


@pytest.mark.timeout(120)
def test_an_opted_in_hand_joined_checkpointer_gives_way_to_a_launched_worker(api_app: Orchestrator) -> None:
    name, join = create_run(api_app, "trust", hand_joined_checkpoint=True)
    hand = register(api_app, join)
    become_checkpointer(api_app, hand)  # no launched worker yet: the opt-in lets it keep the run's work
    assert upload(api_app, hand, 1, checkpoint_bytes(b"by hand")).status_code == 201
    worker = launched(api_app, name)
    wait_until(  # the hand-joined one keeps beating: it is live and keeps up, and still loses the role
        lambda: heartbeat(api_app, hand) and heartbeat(api_app, worker)["checkpointer"],
        30,
        message="the launched worker checkpoints the run",
    )
    assert checkpointer_events(api_app, name)[-1] == f"worker {worker['worker_id']} checkpoints the run"


@pytest.mark.timeout(120)
def test_bytes_that_are_no_checkpoint_are_refused_with_422(api_app: Orchestrator) -> None:
    """Before, a checkpointer's b"junk" was stored (201) and offered to every worker as the run's resume
    checkpoint, which each failed to load."""
    name, join = create_run(api_app, "trust")
    worker = launched(api_app, name)
    become_checkpointer(api_app, worker)
    plain_zip = checkpoint_bytes().replace(b"state_dict", b"other_dict")
    for junk in (b"junk", checkpoint_bytes()[:200], plain_zip):
        answer = upload(api_app, worker, 1, junk)
        assert answer.status_code == 422 and "checkpoint" in answer.json()["detail"], answer.text
    with api_app.client() as http:
        assert http.get(api.run_checkpoints(name)).json()["items"] == []
    assert upload(api_app, worker, 1, checkpoint_bytes(b"real")).status_code == 201
    assert register(api_app, join)["resume_checkpoint"]["epoch"] == 1


@pytest.mark.timeout(120)
def test_a_run_may_keep_its_secrets_from_hand_joined_workers(api_app: Orchestrator) -> None:
    """Before, every join-token registration carried every secret_env value, with no way to keep them."""
    kept, kept_join = create_run(api_app, "trust", secret_env={"API_KEY": SECRET}, hand_joined_secrets=False)
    hand = register(api_app, kept_join)
    assert hand["secret_env"] == {} and hand["run"]["secret_env"] == {"API_KEY": None}
    assert launched(api_app, kept)["secret_env"] == {"API_KEY": SECRET}
    assert not set(SERVER_ONLY_SPEC_FIELDS) & set(hand["run"])  # workers have no use for them
    _, shared_join = create_run(api_app, "trust", secret_env={"API_KEY": SECRET})  # the default: shared
    assert register(api_app, shared_join)["secret_env"] == {"API_KEY": SECRET}
    with api_app.admin() as http:
        shown = http.get(api.run(kept)).json()["spec"]
    assert shown["hand_joined_secrets"] is False and shown["hand_joined_checkpoint"] is True


@pytest.mark.timeout(120)
def test_a_resume_failure_is_recorded_once_and_only_for_a_stored_checkpoint(api_app: Orchestrator) -> None:
    """Workers report checkpoints that do not load (worker/agent/resume.py): a report names a stored
    checkpoint and its uploader, once; a worker cannot fill the events with made-up epochs."""
    name, join = create_run(api_app, "trust")
    uploader = launched(api_app, name)
    become_checkpointer(api_app, uploader)
    assert upload(api_app, uploader, 1, checkpoint_bytes(b"real")).status_code == 201
    hand = register(api_app, join)
    path = api.resume_failure(hand["worker_id"])
    with api_app.client(hand["worker_token"]) as http:
        unknown = http.post(path, json={"epoch": 7, "message": "made up"})
        answers = [http.post(path, json={"epoch": 1, "message": "KeyError: x"}).status_code for _ in range(3)]
    assert unknown.status_code == 404 and "no checkpoint at epoch 7" in unknown.json()["detail"], unknown.text
    assert answers == [204, 204, 204]
    with api_app.client() as http:
        events = http.get(api.run_events(name)).json()["items"]
    expected = (
        f"worker {hand['worker_id']} could not resume from the checkpoint of epoch 1, uploaded by worker "
        f"{uploader['worker_id']}: KeyError: x"
    )
    assert [e["message"] for e in events if e["kind"] == "checkpoint.unloadable"] == [expected]
