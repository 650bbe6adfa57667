"""A worker agent killed with SIGKILL on its PID alone leaves nothing behind.

A real orchestrator and a real agent training the digits example (not in a process group that anyone
kills: only the agent's PID gets SIGKILL, as a user's ``kill -9 <pid>`` does). Its forked hivemind
processes hold a lifeline (``worker/lifeline.py``): the DHT takes its ``p2pd`` with it as soon as the agent
is gone, and no process of the agent's family (descendants and process group) is left.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.support.agent import start_training_agent
from tests.support.processes import ProcessRegistry, alive_of, process_family
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.swarm]
GONE_WITHIN_S = 5.0


@pytest.mark.timeout(300)
def test_agent_killed_by_pid_takes_its_dht_and_p2pd_with_it(
    processes: ProcessRegistry, tmp_path: Path
) -> None:
    _, agent = start_training_agent(processes, tmp_path, "lifeline")
    family = process_family(agent.pid)
    names = " ".join(alive_of(family).values())
    assert "p2pd" in names, names  # the agent's peer runs: the test sees what it kills

    os.kill(agent.pid, signal.SIGKILL)
    wait_until(
        lambda: not alive_of(family),
        GONE_WITHIN_S,
        interval_s=0.1,
        message=f"the agent's processes end; still running: {alive_of(family)}",
    )
