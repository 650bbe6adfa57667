"""When the heartbeat thread takes the orchestrator for gone: only after ``lost_timeout_s`` without an answer.

The heartbeats go through the real client to a scripted transport (httpx.MockTransport); the clock is
the Heartbeater's injected one, so minutes pass in no time.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.processes import clear_spotswarm_env
from tests.unit.test_worker_client import FakeServer
from worker.agent.client import OrchestratorClient
from worker.agent.config import parse_config
from worker.agent.heartbeat import Heartbeater
from worker.agent.state import AgentState
from worker.protocol.exit_codes import EXIT_USAGE
from worker.protocol.workers import DeregisterReason

REFUSED = httpx.ConnectError("connection refused")
UNKNOWN_WORKER = httpx.Response(404, json={"detail": "no worker w1"})
BUSY = httpx.Response(503, json={"detail": "database unavailable, retry later"})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def heartbeater(
    tmp_path: Path, server: FakeServer, clock: Clock, lost_timeout_s: float, lost: list[float]
) -> tuple[Heartbeater, AgentState]:
    client = OrchestratorClient(
        "http://orch:8000", "wt", retries=0, transport=httpx.MockTransport(server), sleep=lambda _: None
    )
    state = AgentState(checkpoint_every_epochs=5)
    beats = Heartbeater(
        client,
        state,
        "w1",
        "run",
        5.0,
        tmp_path,
        clock=clock,
        lost_timeout_s=lost_timeout_s,
        on_lost=lost.append,
    )
    return beats, state


def test_the_orchestrator_is_lost_after_the_timeout_without_an_answer_once(tmp_path: Path) -> None:
    clock, lost = Clock(), []
    beats, state = heartbeater(tmp_path, FakeServer(REFUSED, BUSY, REFUSED), clock, 60.0, lost)
    for elapsed_s in (10.0, 30.0, 59.0):  # a restart: unreachable, then 5xx while it starts
        clock.now = 1000.0 + elapsed_s
        assert beats.beat() is False
    assert lost == [] and state.stop is None
    clock.now = 1061.0
    beats.beat()
    assert lost == [61.0]
    clock.now = 1100.0
    beats.beat()
    assert lost == [61.0]  # reported once


def test_a_refusal_is_an_answer_and_stops_the_worker_at_once(tmp_path: Path) -> None:
    clock, lost = Clock(), []
    beats, state = heartbeater(tmp_path, FakeServer(UNKNOWN_WORKER, REFUSED), clock, 60.0, lost)
    clock.now = 1050.0
    beats.beat()
    assert state.stop is not None and state.stop.reason == DeregisterReason.stopped
    assert "heartbeat refused" in (state.stop.message or "")
    clock.now = 1100.0  # 100 s since the start, 50 s since the refusal: the orchestrator is there
    beats.beat()
    assert lost == []
    clock.now = 1111.0
    beats.beat()
    assert lost == [61.0]


def test_a_timeout_of_zero_never_gives_up(tmp_path: Path) -> None:
    clock, lost = Clock(), []
    beats, _ = heartbeater(tmp_path, FakeServer(REFUSED), clock, 0.0, lost)
    clock.now = 1000.0 + 7 * 24 * 3600.0
    beats.beat()
    assert lost == []


def test_the_timeout_comes_from_the_flag_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clear_spotswarm_env(monkeypatch)
    monkeypatch.setenv("SPOTSWARM_URL", "http://orch")
    monkeypatch.setenv("SPOTSWARM_JOIN_TOKEN", "ssj_x")
    monkeypatch.setenv("SPOTSWARM_WORKER_DIR", str(tmp_path))
    assert parse_config([]).orchestrator_lost_timeout_s == 900.0
    monkeypatch.setenv("SPOTSWARM_ORCHESTRATOR_LOST_TIMEOUT_S", "30")
    assert parse_config([]).orchestrator_lost_timeout_s == 30.0
    assert parse_config(["--orchestrator-lost-timeout-s", "0"]).orchestrator_lost_timeout_s == 0.0
    with pytest.raises(SystemExit) as exit_info:
        parse_config(["--orchestrator-lost-timeout-s", "-1"])
    assert exit_info.value.code == EXIT_USAGE
