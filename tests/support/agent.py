"""Agents started by hand (``spotswarm-worker`` with a run's join token, as a user starts one), and a real
orchestrator with one such agent training the run `spotswarm demo` trains (digits, one worker): what
the tests of an agent's exits start from."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from orchestrator.cli.demo import demo_spec
from tests.support import api
from tests.support.orchestrator import NO_RECONCILE, Orchestrator, start_orchestrator
from tests.support.processes import VENV_BIN, ManagedProcess, ProcessRegistry
from tests.support.waiting import BOOT_S, wait_until

#: the orchestrator an agent test starts from: no reconcile loop, no import probe
AGENT_TEST_ENV = {**NO_RECONCILE, "SPOTSWARM_CHECK_IMPORTS": "false"}


def start_hand_agent(
    processes: ProcessRegistry,
    name: str,
    url: str,
    join_token: str,
    worker_dir: Path,
    env: Mapping[str, str] | None = None,
    *,
    preloaded: bool = True,
) -> ManagedProcess:
    """Start one agent joining with ``join_token`` the orchestrator at ``url``, in its own process group:
    its files in ``worker_dir``, no metadata service, its DHT on 127.0.0.1, more settings in ``env``.
    With ``preloaded`` it is forked with its imports done (:mod:`tests.support.preloaded`); without,
    exec'd as users start it."""
    agent_env = {
        "SPOTSWARM_URL": url,
        "SPOTSWARM_JOIN_TOKEN": join_token,
        "SPOTSWARM_WORKER_DIR": str(worker_dir),
        "SPOTSWARM_METADATA_URL": "off",
        "SPOTSWARM_HOST_MADDRS": "/ip4/127.0.0.1/tcp/0",
        **(env or {}),
    }
    return processes.start(name, [str(VENV_BIN / "spotswarm-worker")], env=agent_env, preloaded=preloaded)


def start_training_agent(
    processes: ProcessRegistry,
    tmp_path: Path,
    run_name: str,
    agent_env: Mapping[str, str] | None = None,
    orch: Orchestrator | None = None,
    *,
    preloaded: bool = True,
) -> tuple[Orchestrator, ManagedProcess]:
    """Start an orchestrator (:data:`AGENT_TEST_ENV`) unless ``orch`` is given (one with those settings,
    shared by a module's tests), create the demo run ``run_name``, start one agent with the join token
    (plus ``agent_env``; :func:`start_hand_agent`), and wait until it trains."""
    if orch is None:
        orch = start_orchestrator(processes, tmp_path / "orch", extra_env=AGENT_TEST_ENV)
    # the hand-started agent stands in for a launched worker: it checkpoints the run
    spec = {**demo_spec(workers=1), "name": run_name, "hand_joined_checkpoint": True}
    with orch.admin() as http:
        token = http.post(api.runs(), json=spec, timeout=120).raise_for_status().json()["join_token"]
    agent = start_hand_agent(
        processes, "agent", orch.url, token, tmp_path / "agent", agent_env, preloaded=preloaded
    )

    def trains() -> bool:
        if not agent.alive():
            pytest.fail(f"agent exited with {agent.popen.returncode}:\n{agent.log()[-3000:]}")
        with orch.client() as http:
            workers = http.get(api.run_workers(run_name)).raise_for_status().json()["items"]
        return bool(workers) and workers[0]["state"] == "running" and workers[0]["samples"] > 0

    wait_until(trains, BOOT_S, interval_s=1, message="the agent trains")
    return orch, agent
