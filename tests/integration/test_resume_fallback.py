"""A starting worker resumes from the newest of its run's checkpoints that loads into its module, against
a real `spotswarm serve` (the agent's resume choice, ``worker/agent/resume.py``, with its HTTP client):
a newer one that does not fit is reported (an event naming it and its uploader) and skipped for the one
before it; with none that fits, the worker starts without one (security review N1; a launched worker
doing so: tests/e2e/test_poisoned_checkpoint.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support import api
from tests.support.checkpoint_files import checkpoint_bytes
from tests.support.models import TinyModule
from tests.support.orchestrator import HAND_ONLY, Orchestrator
from tests.support.specs import create_run
from tests.support.workers import become_checkpointer, register
from worker.agent.client import OrchestratorClient
from worker.agent.resume import checkpoint_problem, resume_path
from worker.protocol.paths import CHECKSUM_HEADER
from worker.protocol.workers import WorkerRegistered

ORCHESTRATOR_ENV = HAND_ONLY


def lightning_checkpoint(module: torch.nn.Module, path: Path) -> bytes:
    """What the resume choice reads of a Lightning checkpoint of ``module`` (its state and the keys
    ``fit`` needs), as ``torch.save`` writes it."""
    torch.save(
        {"state_dict": module.state_dict(), "pytorch-lightning_version": "2", "optimizer_states": []}, path
    )
    return path.read_bytes()


def upload(orch: Orchestrator, worker: dict[str, Any], epoch: int, data: bytes) -> None:
    with orch.client(worker["worker_token"]) as http:
        headers = {CHECKSUM_HEADER: hashlib.sha256(data).hexdigest()}
        path = api.checkpoint_upload(worker["worker_id"], epoch)
        assert http.put(path, content=data, headers=headers).status_code == 201


def unloadable_events(orch: Orchestrator, name: str) -> list[str]:
    with orch.client() as http:
        events = http.get(api.run_events(name)).json()["items"]
    return [e["message"] for e in events if e["kind"] == "checkpoint.unloadable"]


@pytest.mark.timeout(120)
def test_a_worker_falls_back_to_the_newest_checkpoint_that_loads(
    served_orch: Orchestrator, tmp_path: Path
) -> None:
    name, join = create_run(served_orch, "fallback", keep_checkpoints=3)
    uploader = register(served_orch, join)
    become_checkpointer(served_orch, uploader)
    good = lightning_checkpoint(TinyModule(), tmp_path / "good.ckpt")
    upload(served_orch, uploader, 1, good)
    upload(served_orch, uploader, 2, lightning_checkpoint(TinyModule(hidden=7), tmp_path / "wider.ckpt"))
    torch.save({"state_dict": TinyModule().state_dict()}, tmp_path / "bare.ckpt")  # not Lightning's
    upload(served_orch, uploader, 3, (tmp_path / "bare.ckpt").read_bytes())
    registration = WorkerRegistered.model_validate(register(served_orch, join))
    assert [c.epoch for c in registration.older_checkpoints] == [2, 1]
    assert registration.resume_checkpoint is not None
    candidates = [registration.resume_checkpoint, *registration.older_checkpoints]
    with OrchestratorClient(served_orch.url, registration.worker_token) as client:
        chosen = resume_path(client, registration, tmp_path / "worker", TinyModule(), candidates)
    assert chosen is not None and Path(chosen).read_bytes() == good
    me, by = registration.worker_id, uploader["worker_id"]
    prefix = f"worker {me} could not resume from the checkpoint of epoch {{}}, uploaded by worker {by}: "
    assert unloadable_events(served_orch, name) == [
        prefix.format(3) + "it is no Lightning checkpoint: no pytorch-lightning_version, optimizer_states",
        prefix.format(2)
        + "its state_dict's shapes differ from the module's at ['layer.weight', 'layer.bias']",
    ]


@pytest.mark.timeout(120)
def test_a_worker_starts_without_a_checkpoint_when_none_loads(
    served_orch: Orchestrator, tmp_path: Path
) -> None:
    name, join = create_run(served_orch, "fallback")
    uploader = register(served_orch, join)
    become_checkpointer(served_orch, uploader)
    upload(served_orch, uploader, 1, checkpoint_bytes(state_dict={"other.weight": 0}))
    registration = WorkerRegistered.model_validate(register(served_orch, join))
    assert registration.resume_checkpoint is not None and registration.older_checkpoints == []
    with OrchestratorClient(served_orch.url, registration.worker_token) as client:
        chosen = resume_path(client, registration, tmp_path, TinyModule(), [registration.resume_checkpoint])
    assert chosen is None and not (tmp_path / "resume" / "resume.ckpt").exists()
    assert len(unloadable_events(served_orch, name)) == 1


def test_bytes_torch_cannot_load_are_a_problem_not_an_exception(tmp_path: Path) -> None:
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(lightning_checkpoint(TinyModule(), tmp_path / "whole.ckpt")[:300])
    problem = checkpoint_problem(cut, TinyModule())
    assert problem is not None and problem.startswith("it does not load: "), problem
