"""Swarm admission through a real orchestrator: only workers it registered take part in a run's swarm.

Who gets a token is the API's part: tests/api/test_swarm_tokens.py. The swarm test starts two worker
agents (digits example), lets them train, then runs one probe process (tests/programs/swarm_probe.py):
first a hand-started ``HivemindStrategy(authorizer=...)`` with a token trains a few steps with the
agents; then peers join the DHT as intruders (no token, a forged token, an expired token, a token of
another run) and finally as an admitted peer: the intruders can neither write nor read the run's
progress key nor use the workers' averagers, while the admitted probe can, and its record shows in the
swarm the orchestrator reads from the workers. Last, the orchestrator and one agent are killed; the agent,
restarted by hand, rejoins the swarm on the token it cached, and heartbeats again once the orchestrator
is back.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent import start_hand_agent
from tests.support.orchestrator import HAND_ONLY, NO_RECONCILE, Orchestrator, start_orchestrator
from tests.support.processes import VENV_BIN, ProcessRegistry
from tests.support.runs import GRADIENTS, digits_run
from tests.support.specs import post_run, run_spec
from tests.support.waiting import BOOT_S, wait_until
from tests.support.workers import register
from worker.admission.tokens import (
    parse_expiration,
)

pytestmark = [pytest.mark.swarm]
INTRUDERS = ("none", "forged", "expired", "other_run")
#: long enough for a killed agent to restart on its cached token (at least 0.6 of it is left at the kill),
#: short enough that the renewals at half-life come about when the probe ends, not long after it
TOKEN_TTL_S = 40
DIGITS = digits_run(
    "adm-swarm",
    module_args={},  # the example's own defaults
    target_batch_size=64,
    batch_size=16,
    # gradient averaging, as the hand-started HivemindStrategy's own default (it takes no run options)
    strategy_options=dict(GRADIENTS),
    checkpoint_every_epochs=1000,
    hand_joined_checkpoint=False,
)


# no import probe at run creation; tokens live TOKEN_TTL_S, so agents renew theirs (at half-life) while
# the tests run, from their DHT processes
ORCHESTRATOR_ENV = {**HAND_ONLY, "SPOTSWARM_SWARM_TOKEN_TTL_S": str(TOKEN_TTL_S)}


def start_agent(
    processes: ProcessRegistry,
    tmp_path: Path,
    name: str,
    orch: Orchestrator,
    token: str,
    worker_dir: str | None = None,
    extra_env: dict[str, str] | None = None,
) -> Any:
    env = {
        "SPOTSWARM_STOP_GRACE_S": "20",
        # the peer list cached every few seconds, not every minute: the restart below waits for one that
        # holds the other agent's address
        "SPOTSWARM_PEERS_REFRESH_S": "3",
        **(extra_env or {}),
    }
    return start_hand_agent(processes, name, orch.url, token, tmp_path / (worker_dir or name), env)


def run_view(orch: Orchestrator, name: str, path: str = "") -> Any:
    with orch.client(timeout_s=15) as http:
        return http.get(f"/api/v1/runs/{name}{path}").raise_for_status().json()


@pytest.mark.timeout(420)
def test_only_admitted_peers_join_the_runs_swarm(
    served_orch: Orchestrator, processes: ProcessRegistry, tmp_path: Path
) -> None:
    run = post_run(served_orch, DIGITS)
    other_run = post_run(served_orch, run_spec("adm-other"))
    open_run = post_run(served_orch, run_spec("adm-open-swarm", strategy_options={"swarm_admission": False}))
    agents = [
        start_agent(processes, tmp_path, n, served_orch, run["join_token"]) for n in ("first", "second")
    ]
    config_path, out_path = tmp_path / "probe.json", tmp_path / "probe-out.json"
    probe = processes.start(  # imports now, runs once the config file appears
        "probe",
        [str(VENV_BIN / "python"), "-m", "tests.programs.swarm_probe", str(config_path), str(out_path)],
        preloaded=True,
    )

    def trained_together() -> Any:
        workers = [
            w for w in run_view(served_orch, "adm-swarm", "/workers")["items"] if w["state"] == "running"
        ]
        together = len(workers) == 2 and all(w["num_peers"] >= 2 and w["samples"] > 0 for w in workers)
        return together and workers

    wait_until(trained_together, BOOT_S, interval_s=1, message="two admitted agents train in one swarm")
    epoch = run_view(served_orch, "adm-swarm")["reported"]["swarm_epoch"]
    wait_until(
        lambda: run_view(served_orch, "adm-swarm")["reported"]["swarm_epoch"] >= epoch + 2,
        90,
        interval_s=1,
        message="the swarm epoch advances with two admitted peers",
    )
    worker_maddrs = run_view(served_orch, "adm-swarm", "/peers")["worker_peers"]
    target = worker_maddrs[0].rsplit("/p2p/", 1)[1]

    config = {
        "url": served_orch.url,
        "swarm_id": run["swarm_id"],
        "initial_peers": served_orch.peers() + worker_maddrs,
        "worker_peer_id": target,
        "authority_key_path": str(served_orch.data_dir / "swarm_authority.pem"),
        "admitted": credentials(register(served_orch, run["join_token"]), run["swarm_id"]),
        "other_run": credentials(register(served_orch, other_run["join_token"]), other_run["swarm_id"]),
        "strategy": credentials(register(served_orch, run["join_token"]), run["swarm_id"]),
        "orchestrator_peers": served_orch.peers(),
        "open_run": "adm-open-swarm",
        "open_swarm_id": open_run["swarm_id"],
        "modes": ["strategy", *INTRUDERS, "admitted", "open"],
    }
    (tmp_path / "probe.tmp").write_text(json.dumps(config))
    (tmp_path / "probe.tmp").replace(config_path)
    wait_until(
        lambda: not probe.alive(),
        210,
        interval_s=0.5,
        message=lambda: f"the probe ends\n{probe.log()[-3000:]}",
    )
    assert probe.popen.returncode == 0, probe.log()[-3000:]
    results = json.loads(out_path.read_text())

    # a run that opted out still works on this orchestrator: a token-less peer reaches it and is read
    assert results["open"]["orchestrator_saw"], results["open"]
    trained = results["strategy"]  # HivemindStrategy(authorizer=...) started by hand: trains with the agents
    assert trained["peers"] >= 3 and trained["last_epoch"] > trained["first_epoch"], trained
    assert trained["dht_peer_id"] == trained["token_peer_id"], trained
    reasons = {
        "none": "showed no token",
        "forged": "not signed by this orchestrator",
        "expired": "expired",
        "other_run": "not 'adm-swarm",
    }
    for mode in INTRUDERS:
        result = results[mode]
        assert not result["stored"] and result["others_seen"] == 0, (mode, result)
        for call in ("download_state", "join_group"):
            assert "not admitted to this swarm" in result[call] and reasons[mode] in result[call], (
                mode,
                result,
            )
    admitted = results["admitted"]
    assert admitted["stored"] and admitted["others_seen"] >= 2, admitted
    assert admitted["download_state"].startswith("ok") and admitted["join_group"].startswith("ok"), admitted

    def admitted_record_visible() -> Any:
        swarm = run_view(served_orch, "adm-swarm")["swarm"]
        return swarm and swarm["num_clients"] == 1 and swarm

    swarm = wait_until(admitted_record_visible, 30, message="the admitted probe's record reaches the workers")
    assert swarm["num_peers"] >= 3 and swarm["epoch"] < 1000, swarm  # two agents + the admitted probe
    assert all(w["swarm_epoch"] < 1000 for w in run_view(served_orch, "adm-swarm", "/workers")["items"])
    assert all(agent.alive() for agent in agents)
    # tokens live TOKEN_TTL_S and are renewed at half-life: the agents train on by renewing theirs (first
    # token + renewals); on a quiet machine the steps above take less than the half-life, so wait for it
    wait_until(
        lambda: all(agent.log().count("swarm token for") >= 2 for agent in agents),
        TOKEN_TTL_S,
        interval_s=1,
        message="both agents renewed their swarm tokens",
    )
    assert all(agent.alive() for agent in agents)

    restart_on_cached_token(served_orch, processes, tmp_path, agents, run)


def cached_token_lifetime_s(worker_dir: Path) -> float:
    """Seconds left on the swarm token the agent cached in ``worker_dir`` (0 if none)."""
    files = list((worker_dir / "swarm").glob("*/token.json"))
    if not files:
        return 0.0
    return parse_expiration(json.loads(files[0].read_text())["token"]["expiration_time"]) - time.time()


def restart_on_cached_token(
    orch: Orchestrator, processes: ProcessRegistry, tmp_path: Path, agents: list[Any], run: dict[str, Any]
) -> None:
    """Orchestrator and second agent killed (-9); the agent restarted by hand rejoins the swarm on its
    cached registration, peers and swarm token, downloading the swarm's state from the first agent
    (which only an admitted peer can); the orchestrator comes back and the agent heartbeats again."""
    # kill just after both agents renewed (each at half-life), so their tokens outlive the restart:
    # tokens cannot be renewed while the orchestrator is down
    wait_until(
        lambda: min(cached_token_lifetime_s(tmp_path / n) for n in ("first", "second")) > 0.6 * TOKEN_TTL_S,
        TOKEN_TTL_S,
        interval_s=0.5,
        message="both agents renewed their tokens",
    )
    # and once the second agent cached a peer besides the orchestrator's (its peer list is refreshed every
    # --peers-refresh-s): the orchestrator's DHT is killed too
    orchestrator_peers = set(orch.peers())
    wait_until(
        lambda: (
            set(json.loads((tmp_path / "second" / "peers.json").read_text())["initial_peers"])
            - orchestrator_peers
        ),
        90,
        interval_s=0.5,
        message="the second agent cached the first one's address",
    )
    agent_ids = {
        json.loads((tmp_path / n / "registration.json").read_text())["registration"]["worker_id"]
        for n in ("first", "second")
    }
    known = len(run_view(orch, "adm-swarm", "/workers")["items"])
    orch.kill()
    agents[1].kill()
    restarted = start_agent(
        processes,
        tmp_path,
        "second-restarted",
        orch,
        run["join_token"],
        worker_dir="second",
        extra_env={"SPOTSWARM_REGISTER_TIMEOUT_S": "2"},
    )
    wait_until(
        lambda: "Joined swarm" in restarted.log() or not restarted.alive(),
        BOOT_S,
        interval_s=0.5,
        message="the restarted agent downloads the swarm's state",
    )
    log = restarted.log()
    assert restarted.alive(), log[-3000:]
    assert "joining the swarm with the cached swarm token" in log, log[-3000:]
    assert "rejoining run adm-swarm as worker" in log, log[-3000:]
    assert agents[0].alive()

    back = start_orchestrator(
        processes,
        orch.data_dir,
        extra_env={**NO_RECONCILE, "SPOTSWARM_CHECK_IMPORTS": "false"},
        port=orch.port,
        dht_port=orch.dht_port,
        name="orchestrator-back",
    )

    back_at = datetime.now(UTC)

    def heartbeats_again() -> bool:
        workers = run_view(back, "adm-swarm", "/workers")["items"]
        fresh = [
            w
            for w in workers
            if w["id"] in agent_ids
            and w["state"] == "running"
            and w["num_peers"] >= 2
            and datetime.fromisoformat(w["last_heartbeat_at"]) > back_at
        ]
        return len(workers) == known and len(fresh) == 2

    wait_until(heartbeats_again, 90, interval_s=1, message="both agents heartbeat, two peers, no new worker")


def credentials(registered: dict[str, Any], swarm_id: str) -> dict[str, str]:
    return {"id": registered["worker_id"], "token": registered["worker_token"], "swarm_id": swarm_id}
