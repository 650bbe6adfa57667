"""A worker agent whose orchestrator is gone for good (killed with -9) leaves after its bounded timeout.

A real orchestrator and a real agent training the digits example; the orchestrator is killed with
SIGKILL (as a demo killed with `kill -9`) and never comes back. The agent keeps training for
``SPOTSWARM_ORCHESTRATOR_LOST_TIMEOUT_S`` (made short here), then leaves the swarm without uploading or
deregistering and exits with code 4; its whole process group (the agent, its hivemind processes, p2pd)
is gone within the bound.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.agent import start_training_agent
from tests.support.processes import ProcessRegistry, group_members
from tests.support.waiting import wait_until
from worker.protocol.exit_codes import EXIT_ORCHESTRATOR_LOST

pytestmark = [pytest.mark.swarm]
LOST_TIMEOUT_S = 5.0  # the default is 900 s; what is tested is the leave after it, not its length
STOP_GRACE_S = 15.0  # the agent's default: the most its leaving may take
# After the timeout: one more heartbeat attempt (an interval of 1 s, a refused connection and one retry)
# to notice, then leaving within the stop grace.
LEAVE_BOUND_S = LOST_TIMEOUT_S + 5.0 + STOP_GRACE_S


@pytest.mark.timeout(420)
def test_agent_leaves_when_the_orchestrator_is_gone_for_good(
    processes: ProcessRegistry, tmp_path: Path
) -> None:
    orch, agent = start_training_agent(
        processes, tmp_path, "lost", {"SPOTSWARM_ORCHESTRATOR_LOST_TIMEOUT_S": str(LOST_TIMEOUT_S)}
    )
    orch.kill()
    killed_at = time.monotonic()

    wait_until(
        lambda: not agent.alive(), LEAVE_BOUND_S, message=lambda: f"the agent leaves\n{agent.log()[-3000:]}"
    )
    waited_s = time.monotonic() - killed_at
    assert agent.popen.returncode == EXIT_ORCHESTRATOR_LOST, agent.log()[-3000:]
    assert (
        waited_s >= LOST_TIMEOUT_S - 2.0
    )  # it rode out the silence first (the last answer came <= 1 s before)
    wait_until(lambda: not group_members(agent.pid), 5, message="the agent's process group is gone")
    log = agent.log()
    assert "the orchestrator answered no heartbeat for" in log and "exiting with code 4" in log
    assert "deregistered" not in log and "could not deregister" not in log  # it did not try
