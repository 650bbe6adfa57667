"""The worker agent's failure paths against a real orchestrator: each ends fast, with one clear line."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import api
from tests.support.agent import start_hand_agent
from tests.support.orchestrator import HAND_ONLY, Orchestrator
from tests.support.ports import free_port
from tests.support.processes import ProcessRegistry
from tests.support.specs import run_spec
from tests.support.waiting import wait_until
from worker.protocol.exit_codes import EXIT_CONFIG, EXIT_FAILED, EXIT_OK

FAST_EXIT_S = 60.0  # a failing agent imports httpx and pydantic only; generous for a busy machine


# No import check: a run below names a module that exists nowhere, as a worker image might lack it.
ORCHESTRATOR_ENV = HAND_ONLY


def create_run(orch: Orchestrator, name: str, **overrides: Any) -> str:
    with orch.admin() as http:
        response = http.post(api.runs(), json=run_spec(name, **overrides))
    assert response.status_code == 201, response.text
    return str(response.json()["join_token"])


def start_agent(
    processes: ProcessRegistry, tmp_path: Path, name: str, url: str, token: str, **env: str
) -> Any:
    # exec'd, not preloaded: these agents end before they import Lightning, torch and hivemind
    return start_hand_agent(processes, name, url, token, tmp_path / name, env, preloaded=False)


def wait_exit(proc: Any, timeout_s: float) -> int:
    began = time.monotonic()
    wait_until(lambda: not proc.alive(), timeout_s, message=lambda: f"agent exits\n{proc.log()[-3000:]}")
    assert time.monotonic() - began < timeout_s
    return int(proc.popen.returncode)


@pytest.mark.timeout(120)
def test_bad_join_token_is_a_clear_permanent_error(
    served_orch: Orchestrator, processes: ProcessRegistry, tmp_path: Path
) -> None:
    create_run(served_orch, "tok")
    agent = start_agent(processes, tmp_path, "agent", served_orch.url, "ssj_not-the-token")
    assert wait_exit(agent, FAST_EXIT_S) == EXIT_CONFIG
    errors = [line for line in agent.log().splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "rejected the join token" in errors[0], agent.log()[-2000:]


@pytest.mark.timeout(120)
def test_module_that_fails_to_import_is_reported_on_the_run(
    served_orch: Orchestrator, processes: ProcessRegistry, tmp_path: Path
) -> None:
    token = create_run(served_orch, "imp", module="tests.integration.no_such_module:Model")
    agent = start_agent(processes, tmp_path, "agent", served_orch.url, token)
    assert wait_exit(agent, FAST_EXIT_S) == EXIT_CONFIG
    assert "cannot build tests.integration.no_such_module:Model: ModuleNotFoundError" in agent.log()
    with served_orch.client() as http:
        workers = http.get(api.run_workers("imp")).json()["items"]
        events = " ".join(e["message"] for e in http.get(api.run_events("imp")).json()["items"])
    assert [w["state"] for w in workers] == ["failed"]
    assert "No module named 'tests.integration.no_such_module'" in workers[0]["exit_reason"]
    assert f"deregistered ({workers[0]['exit_reason']})" in events  # the event carries the message


@pytest.mark.timeout(120)
def test_a_failure_message_quoting_a_secret_reaches_no_reader_and_no_log(
    served_orch: Orchestrator, processes: ProcessRegistry, tmp_path: Path
) -> None:
    secret = "sk-LEAKME-abcdef123456"
    token = create_run(
        served_orch,
        "sec",
        module="tests.support.models:CredentialQuotingModule",
        secret_env={"API_KEY": secret},
    )
    agent = start_agent(processes, tmp_path, "agent", served_orch.url, token)
    assert wait_exit(agent, FAST_EXIT_S) == EXIT_CONFIG
    paths = [api.run("sec"), api.run_workers("sec"), api.run_events("sec")]
    with served_orch.client() as anonymous:
        seen = {path: anonymous.get(path).text for path in paths}
    # the failure is still told, with the secret masked, by the worker before it sends it
    assert "Unauthorized for url: https://api.example/whoami?token=***" in seen[api.run_events("sec")]
    assert "whoami?token=***" in agent.log(), agent.log()[-2000:]
    leaks = dict(seen)
    leaks.update({"agent log": agent.log(), "server log": served_orch.proc.log()})
    assert [where for where, text in leaks.items() if secret in text] == []


@pytest.mark.timeout(120)
def test_a_mistyped_module_argument_is_refused_by_the_worker_and_a_hand_joined_one_fails_no_run(
    served_orch: Orchestrator, processes: ProcessRegistry, tmp_path: Path
) -> None:
    # the create-time check (off here) refuses this spec; a worker checks it again before building
    token = create_run(served_orch, "typed", module_args={"hidden": "sixteen"})
    agent = start_agent(processes, tmp_path, "agent", served_orch.url, token)
    assert wait_exit(agent, FAST_EXIT_S) == EXIT_CONFIG
    assert "module_args.hidden: expected int, got 'sixteen'" in agent.log()
    with served_orch.client() as http:
        run = http.get(api.run("typed")).json()
        workers = http.get(api.run_workers("typed")).json()["items"]
    assert [w["state"] for w in workers] == ["failed"]
    # an unusable spec fails a run at its first launched worker; the join token's holder cannot fail it
    assert run["state"] == "running", run["state_reason"]


@pytest.mark.timeout(60)
def test_unreachable_orchestrator_without_cache_exits_retryable(
    processes: ProcessRegistry, tmp_path: Path
) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    agent = start_agent(processes, tmp_path, "agent", nowhere, "ssj_x", SPOTSWARM_REGISTER_TIMEOUT_S="1")
    assert wait_exit(agent, 45) == EXIT_FAILED
    assert "stayed unreachable" in agent.log()


@pytest.mark.timeout(60)
def test_an_agent_told_to_stop_while_the_orchestrator_is_unreachable_leaves_without_waiting_for_it(
    processes: ProcessRegistry, tmp_path: Path
) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    agent = start_agent(processes, tmp_path, "agent", nowhere, "ssj_x", SPOTSWARM_REGISTER_TIMEOUT_S="120")
    wait_until(lambda: "will retry registering" in agent.log(), FAST_EXIT_S, message="retrying")
    agent.signal_group(signal.SIGTERM)
    # one call's retries (backoff up to 4 s each) at most, well within the 15 s stop grace of the watchdog
    assert wait_exit(agent, 12) == EXIT_OK
    assert "told to stop while the orchestrator" in agent.log()
