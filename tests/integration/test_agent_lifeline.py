"""A worker agent killed with SIGKILL leaves nothing behind, and a SIGTERM to its whole process group is
an orderly leave.

A real orchestrator (one for the module's tests, each with a run of its own) and a real agent training
the digits example, in a process group of its own. Killed
on its PID alone (a user's ``kill -9 <pid>``): its forked hivemind processes hold a lifeline
(``worker/runtime/lifeline.py``), and the DHT takes its ``p2pd`` with it as soon as the agent is gone. Killed
with its group: ``p2pd``, in a session of its own, ends with the DHT (the kernel's parent-death signal).
Either way no process of the agent's family (descendants and process group) is left. Sent SIGTERM with
its group (systemd's default stop): hivemind's processes let it pass, so the agent leaves in order.
The agents are exec'd as users start them (not forked preloaded): these tests are about their processes.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.support.agent import AGENT_TEST_ENV, start_training_agent
from tests.support.orchestrator import Orchestrator
from tests.support.processes import ProcessRegistry, alive_of, process_family
from tests.support.runs import RunReader
from tests.support.waiting import BOOT_S, wait_until

pytestmark = [pytest.mark.swarm]
ORCHESTRATOR_ENV = AGENT_TEST_ENV  # one orchestrator (the ``orch`` fixture) for the module's tests
GONE_WITHIN_S = 5.0


#: how a SIGKILL reaches the agent: a user's ``kill -9 <pid>``, or its whole process group (a launcher's)
KILLS = {"pid": os.kill, "group": os.killpg}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("target", list(KILLS))
def test_agent_killed_takes_its_dht_and_p2pd_with_it(
    served_orch: Orchestrator, processes: ProcessRegistry, tmp_path: Path, target: str
) -> None:
    _, agent = start_training_agent(
        processes, tmp_path, f"lifeline-{target}", orch=served_orch, preloaded=False
    )
    family = process_family(agent.pid)
    names = " ".join(alive_of(family).values())
    assert "p2pd" in names, names  # the agent's peer runs: the test sees what it kills

    KILLS[target](agent.pid, signal.SIGKILL)
    wait_until(
        lambda: not alive_of(family),
        GONE_WITHIN_S,
        interval_s=0.1,
        message=f"the agent's processes end; still running: {alive_of(family)}",
    )


#: from a SIGTERM to the agent's group to its exit: its final checkpoint, a last heartbeat, a goodbye
LEFT_WITHIN_S = 10.0


@pytest.mark.timeout(300)
def test_a_sigterm_to_the_agents_group_is_an_orderly_leave(
    served_orch: Orchestrator, processes: ProcessRegistry, tmp_path: Path
) -> None:
    _, agent = start_training_agent(processes, tmp_path, "group-sigterm", orch=served_orch, preloaded=False)
    reader = RunReader(served_orch, "group-sigterm")
    # past its first epoch, the state it holds is newer than any stored: it owes a final checkpoint
    wait_until(lambda: reader.epoch() >= 1, BOOT_S, interval_s=0.5, message="the agent's first swarm epoch")
    family = process_family(agent.pid)
    os.killpg(agent.pid, signal.SIGTERM)
    wait_until(
        lambda: not agent.alive(),
        LEFT_WITHIN_S,
        interval_s=0.1,
        message=lambda: f"the agent leaves\n{agent.log()[-3000:]}",
    )
    log = agent.log()
    assert agent.popen.returncode == 0, log[-3000:]
    after = log[log.index("Received SIGTERM") :]  # Lightning's line, as the agent's handler runs
    # its hivemind processes outlived the signal: the strategy's teardown said goodbye through them,
    # and the agent, the run's checkpointer, uploaded its final checkpoint
    assert "ended by a signal" not in after and "still running" not in after, after
    assert "uploaded checkpoint" in after and "deregistered: stopped (received SIGTERM)" in after, log[-6000:]
    assert "Traceback" not in log, after
    wait_until(
        lambda: not alive_of(family), GONE_WITHIN_S, message=lambda: f"still running: {alive_of(family)}"
    )
