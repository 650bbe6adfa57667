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

from orchestrator.cli.demo import demo_spec
from tests.helpers import VENV_BIN, ProcessRegistry, alive_of, process_family, wait_until
from tests.orchestrator_fixture import NO_RECONCILE, start_orchestrator

pytestmark = [pytest.mark.swarm]
BOOT_S = 180.0  # importing torch, Lightning and hivemind on a busy 2-core machine
GONE_WITHIN_S = 5.0
SPEC = {**demo_spec(workers=1), "name": "lifeline"}


@pytest.mark.timeout(300)
def test_agent_killed_by_pid_takes_its_dht_and_p2pd_with_it(
    processes: ProcessRegistry, tmp_path: Path
) -> None:
    orch = start_orchestrator(
        processes, tmp_path / "orch", extra_env={**NO_RECONCILE, "SPOTSWARM_CHECK_IMPORTS": "false"}
    )
    with orch.admin() as http:
        token = http.post("/api/v1/runs", json=SPEC, timeout=120).raise_for_status().json()["join_token"]
    env = {
        "SPOTSWARM_URL": orch.url,
        "SPOTSWARM_JOIN_TOKEN": token,
        "SPOTSWARM_WORKER_DIR": str(tmp_path / "agent"),
        "SPOTSWARM_METADATA_URL": "off",
        "SPOTSWARM_HOST_MADDRS": "/ip4/127.0.0.1/tcp/0",
    }
    agent = processes.start("agent", [str(VENV_BIN / "spotswarm-worker")], env=env)

    def trains() -> bool:
        if not agent.alive():
            pytest.fail(f"agent exited with {agent.popen.returncode}:\n{agent.log()[-3000:]}")
        with orch.client() as http:
            workers = http.get("/api/v1/runs/lifeline/workers").raise_for_status().json()["items"]
        return bool(workers) and workers[0]["state"] == "running" and workers[0]["samples"] > 0

    wait_until(trains, BOOT_S, interval_s=1, message="the agent trains")
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
