"""The agent's heartbeats after a spot notice it trains on through: ``leaving`` (so the orchestrator
launches the replacement now), until the last one as it goes, which says ``stopping``."""

from __future__ import annotations

from worker.agent.state import AgentState
from worker.protocol.workers import LEAVING_PHASE


def test_heartbeats_say_leaving_after_a_notice_until_the_worker_stops() -> None:
    state = AgentState(checkpoint_every_epochs=5)
    state.update_progress(phase="training")
    assert state.heartbeat().phase == "training"

    state.mark_leaving()
    assert state.heartbeat().phase == LEAVING_PHASE
    state.update_progress(phase="training")  # the training thread's own updates do not hide it
    assert state.heartbeat().phase == LEAVING_PHASE

    state.update_progress(phase="stopping")
    assert state.heartbeat().phase == "stopping"
