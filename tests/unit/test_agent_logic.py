"""The worker agent's decisions, without training: registration fallback, resume rule, checkpoint cadence,
stop requests, configuration and user-object building."""

from __future__ import annotations

import json
import logging
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.processes import clear_spotswarm_env
from worker.agent.agent import seconds_until
from worker.agent.boot import (
    OrchestratorUnavailable,
    PermanentError,
    RunNotAccepting,
    build_user_objects,
    register,
)
from worker.agent.checkpoints import Checkpointer, live_peer_epochs, live_record_max_age_s, should_resume
from worker.agent.client import OrchestratorClient
from worker.agent.config import AgentSettings, parse_config
from worker.agent.metrics import read_loss
from worker.agent.state import CHECKPOINTER_GIVEN_UP, CHECKPOINTER_TAKEN, AgentState
from worker.protocol.runs import RunSpec, StopCondition
from worker.protocol.workers import CheckpointRef, DeregisterReason, HeartbeatReply, WorkerAction

SPEC = {
    "name": "demo",
    "module": "worker.examples.digits:DigitsModule",
    "datamodule": "worker.examples.digits:DigitsDataModule",
    "target_batch_size": 64,
    "batch_size": 16,
}


def registered(peers: list[str]) -> dict[str, Any]:
    return {
        "worker_id": "7",
        "worker_token": "wt",
        "run": SPEC,
        "swarm_id": "demo-1",
        "initial_peers": peers,
        "heartbeat_interval_s": 1.0,
    }


def client_for(handler: Any) -> OrchestratorClient:
    return OrchestratorClient("http://orch", transport=httpx.MockTransport(handler), retries=0)


def config(tmp_path: Path, **overrides: Any) -> AgentSettings:
    values: dict[str, Any] = {"url": "http://orch", "join_token": "ssj_a", "worker_dir": tmp_path}
    return AgentSettings(**{**values, "register_timeout_s": 0.0, **overrides})


def test_registration_is_cached_and_used_while_the_orchestrator_is_down(tmp_path: Path) -> None:
    up = client_for(lambda request: httpx.Response(200, json=registered(["/ip4/1.2.3.4/tcp/1/p2p/A"])))
    boot = register(up, config(tmp_path), sleep=lambda s: None)
    assert not boot.from_cache and boot.registration.worker_id == "7"
    assert (tmp_path / "registration.json").stat().st_mode & 0o777 == 0o600
    peers = {"run": "demo", "initial_peers": ["/ip4/5.6.7.8/tcp/2/p2p/B"], "saved_at": 0}
    (tmp_path / "peers.json").write_text(json.dumps(peers))  # as the heartbeat thread refreshes it

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    again = register(client_for(refused), config(tmp_path), sleep=lambda s: None)
    assert again.from_cache and again.registration.worker_token == "wt"
    assert again.initial_peers == ["/ip4/5.6.7.8/tcp/2/p2p/B"]
    with pytest.raises(OrchestratorUnavailable):  # another run's token: the cache is not for it
        register(client_for(refused), config(tmp_path, join_token="ssj_b"), sleep=lambda s: None)


@pytest.mark.parametrize(("status", "error"), [(401, PermanentError), (409, RunNotAccepting)])
def test_refused_registration_is_not_retried(tmp_path: Path, status: int, error: type[Exception]) -> None:
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(status, json={"detail": "no"})

    with pytest.raises(error):
        register(client_for(handler), config(tmp_path, register_timeout_s=60.0), sleep=lambda s: None)
    assert len(calls) == 1


def test_user_objects_get_the_batch_size_and_import_errors_are_one_line() -> None:
    module, datamodule = build_user_objects(RunSpec(**SPEC, datamodule_args={"val_fraction": 0.25}))
    assert datamodule.batch_size == 16 and datamodule.val_fraction == 0.25
    assert type(module).__name__ == "DigitsModule"
    with pytest.raises(PermanentError, match=r"^cannot build nowhere\.mod:X: ModuleNotFoundError: No module"):
        build_user_objects(RunSpec(**{**SPEC, "module": "nowhere.mod:X"}))
    with pytest.raises(PermanentError, match="TypeError"):
        build_user_objects(RunSpec(**SPEC, module_args={"no_such_arg": 1}))


def test_resume_only_when_no_live_peer_is_as_far() -> None:
    now = 1000.0
    records = {
        "a": {"epoch": 12, "time": now - 2.0},  # live
        "b": {"epoch": 30, "time": now - 40.0},  # a dead peer's record, not expired yet
        "c": None,  # a peer that left cleanly
    }
    max_age_s = live_record_max_age_s(60.0)
    assert live_peer_epochs(records, now, max_age_s) == [12]
    ref = CheckpointRef(epoch=20, size_bytes=1, sha256="0" * 64, created_at="", download_path="/x")
    assert should_resume(ref, [12]) and should_resume(ref, [])
    assert not should_resume(ref, [20]) and not should_resume(None, [])


def test_checkpoints_follow_the_cadence_and_the_role(tmp_path: Path) -> None:
    state = AgentState(checkpoint_every_epochs=5, latest_checkpoint_epoch=None)
    checkpointer = Checkpointer(OrchestratorClient("http://127.0.0.1:9"), "7", state, tmp_path)
    try:
        assert not checkpointer.due(10)  # not the checkpointer
        state.apply_reply(HeartbeatReply(checkpointer=True, checkpoint_every_epochs=5))
        assert not checkpointer.due(4) and checkpointer.due(5) and checkpointer.due(7)
        state.checkpoint_uploaded(7)
        assert not checkpointer.due(9) and checkpointer.due(10) and checkpointer.due(12)
        assert checkpointer.needs_final(8) and not checkpointer.needs_final(7)
        state.apply_reply(
            HeartbeatReply(checkpointer=True, checkpoint_every_epochs=5, latest_checkpoint_epoch=15)
        )
        assert not checkpointer.due(19) and checkpointer.due(20)
    finally:
        checkpointer.close()


def test_the_agent_logs_each_change_of_its_checkpointer_role(caplog: pytest.LogCaptureFixture) -> None:
    state = AgentState(checkpoint_every_epochs=5, latest_checkpoint_epoch=None)
    caplog.set_level(logging.INFO, logger="worker.agent.state")
    for checkpointer in (False, True, True, False, False):
        state.apply_reply(HeartbeatReply(checkpointer=checkpointer, checkpoint_every_epochs=5))
    assert [r.getMessage() for r in caplog.records] == [CHECKPOINTER_TAKEN, CHECKPOINTER_GIVEN_UP]


class SavingTrainer:
    """What the Checkpointer needs of a Trainer: ``save_checkpoint(path, weights_only=False)``."""

    def save_checkpoint(self, path: str, weights_only: bool | None = None) -> None:
        assert weights_only is False  # the whole state, said (Lightning logs its default at every save)
        Path(path).write_bytes(b"model")


def refusing_then_accepting(refusals: int) -> tuple[OrchestratorClient, list[str]]:
    """A client whose orchestrator refuses connections ``refusals`` times, then stores the upload."""
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if len(calls) <= refusals:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(201, json={})

    return client_for(handler), calls


def test_a_stop_reply_keeps_the_role_and_the_final_upload_waits_for_the_orchestrator(tmp_path: Path) -> None:
    state = AgentState(checkpoint_every_epochs=100, latest_checkpoint_epoch=None)
    state.apply_reply(
        HeartbeatReply(action=WorkerAction.stop, checkpointer=True, checkpoint_every_epochs=100)
    )
    assert state.stop is not None and state.checkpointer
    client, calls = refusing_then_accepting(refusals=3)
    checkpointer = Checkpointer(client, "7", state, tmp_path, retry_interval_s=0.05)
    try:
        assert checkpointer.needs_final(3)
        checkpointer.save(SavingTrainer(), 3)
        assert checkpointer.flush(timeout_s=10)
        assert checkpointer.uploaded_epochs == [3] and len(calls) == 4
        assert state.latest_checkpoint_epoch == 3 and not list(tmp_path.iterdir())
    finally:
        checkpointer.close()


def test_a_final_checkpoint_not_uploaded_by_the_deadline_stays_on_disk(tmp_path: Path) -> None:
    state = AgentState(checkpoint_every_epochs=100, latest_checkpoint_epoch=None)
    client, calls = refusing_then_accepting(refusals=10**6)
    checkpointer = Checkpointer(client, "7", state, tmp_path, retry_interval_s=0.05)
    checkpointer.save(SavingTrainer(), 3)
    assert not checkpointer.flush(timeout_s=0.5)  # the agent's stop grace ran out
    checkpointer.close()
    assert checkpointer.flush(timeout_s=10)  # the upload thread has given up
    assert len(calls) > 2 and checkpointer.uploaded_epochs == []
    assert [p.read_bytes() for p in tmp_path.iterdir()] == [b"model"]


def test_the_first_stop_reason_wins_but_a_spot_notice_overrides() -> None:
    state = AgentState(checkpoint_every_epochs=5)
    assert state.request_stop(DeregisterReason.stopped, "SIGTERM")
    assert not state.request_stop(DeregisterReason.completed, "done")
    assert state.stop is not None and state.stop.reason == DeregisterReason.stopped
    state.request_stop(DeregisterReason.interrupted, "spot", within_s=30.0)
    assert state.stop.reason == DeregisterReason.interrupted and state.stop.deadline < float("inf")
    other = AgentState(checkpoint_every_epochs=5)
    other.apply_reply(HeartbeatReply(action=WorkerAction.stop))
    assert other.stop_requested.is_set() and other.stop is not None
    assert other.stop.reason == DeregisterReason.stopped


def test_stop_listeners_run_once_in_a_thread_of_their_own() -> None:
    state = AgentState(checkpoint_every_epochs=5)
    calls: list[str] = []
    done = threading.Event()

    def listener() -> None:
        calls.append(threading.current_thread().name)
        done.set()

    state.on_stop(listener)
    assert calls == []
    state.request_stop(DeregisterReason.stopped, "SIGTERM")  # as a signal handler would
    state.request_stop(DeregisterReason.interrupted, "spot", within_s=30.0)
    assert done.wait(5.0)
    late = threading.Event()
    state.on_stop(late.set)  # registered after the stop: called at once
    assert late.wait(5.0)
    for thread in threading.enumerate():  # a second call, had there been one, runs in one of these
        if thread.name == "stop-listener":
            thread.join(5.0)
    assert calls == ["stop-listener"], calls


def test_small_readers() -> None:
    now = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
    assert seconds_until("2024-05-01T12:02:00Z", now) == 120.0
    assert seconds_until("soon", now) is None
    assert read_loss({"train_loss": 0.5, "loss": 9.0}) == 0.5
    assert read_loss({"train_loss": float("nan")}) is None and read_loss({}) is None


def test_the_stop_condition_counts_samples_as_whole_epochs_of_the_target_batch() -> None:
    assert StopCondition(target_epochs=3).reached(3, 64)
    assert not StopCondition(target_epochs=3).reached(2, 64)
    # 3 epochs of 64 are 192 samples: short of 200; the 4th epoch's boundary (256) passes it
    assert not StopCondition(target_samples=200).reached(3, 64)
    assert StopCondition(target_samples=200).reached(4, 64)
    # an epoch count is never compared with a sample target as if it were samples
    assert not StopCondition(target_samples=200).reached(199, 1) and StopCondition(
        target_samples=200
    ).reached(4, 50)
    assert not StopCondition().reached(10**6, 64)


def test_flags_win_over_the_environment_and_missing_values_are_usage_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clear_spotswarm_env(monkeypatch)
    for name, value in {
        "URL": "http://env",
        "JOIN_TOKEN": "t",
        "HOST_MADDRS": "/a, /b",
        "STOP_GRACE_S": "",
    }.items():
        monkeypatch.setenv(f"SPOTSWARM_{name}", value)
    parsed = parse_config(["--url", "http://flag", "--worker-dir", str(tmp_path)])
    assert parsed.url == "http://flag" and parsed.join_token == "t" and parsed.host_maddrs == ["/a", "/b"]
    assert parsed.stop_grace_s == 15.0 and parsed.worker_dir == tmp_path.resolve()  # empty: unset
    monkeypatch.delenv("SPOTSWARM_JOIN_TOKEN")
    with pytest.raises(SystemExit) as exit_info:
        parse_config([])
    assert exit_info.value.code == 2


# Every flag of spotswarm-worker and its variable, as launchers, cloud-init and people use them.
AGENT_OPTIONS = [
    "url", "join-token", "request-id", "worker-dir", "metadata-url", "log-level", "log-format",
    "peers-refresh-s", "register-timeout-s", "stop-grace-s", "orchestrator-lost-timeout-s", "host-maddrs",
    "announce-maddrs", "accelerator", "cache-dir", "installer", "install-timeout-s",
]  # fmt: skip


def test_help_lists_every_option_with_its_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_config(["--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for option in AGENT_OPTIONS:
        variable = "SPOTSWARM_" + option.upper().replace("-", "_")
        assert f"--{option}" in text and f"[{variable}]" in text, option
    assert "--log-format {text,json}" in text and "--installer {auto,uv,pip}" in text


def test_a_bad_value_in_the_environment_is_a_usage_error_naming_its_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clear_spotswarm_env(monkeypatch)
    monkeypatch.setenv("SPOTSWARM_INSTALL_TIMEOUT_S", "0")
    with pytest.raises(SystemExit) as exit_info:
        parse_config(["--url", "http://orch", "--join-token", "t", "--worker-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "--install-timeout-s (SPOTSWARM_INSTALL_TIMEOUT_S): " in capsys.readouterr().err


class _RunsCodeWhenUnpickled:
    """What a hostile checkpoint holds: unpickling it calls ``open(marker, "w")``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def test_a_crafted_checkpoint_is_refused_and_runs_no_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pickle

    import torch
    from lightning.pytorch import Trainer
    from lightning.pytorch.demos.boring_classes import BoringModel

    from worker.agent import training

    # torch < 2.6 unpickled everything by default; this variable restores that default on newer torch
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    marker = tmp_path / "code-ran"
    crafted = tmp_path / "crafted.ckpt"
    torch.save({"state_dict": {}, "payload": _RunsCodeWhenUnpickled(marker)}, crafted)
    trainer = Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        training.fit(trainer, BoringModel(), None, str(crafted))
    assert not marker.exists()
