"""Two real peers on 127.0.0.1 in ``sync="local"`` mode (hivemind's local SGD) count their epochs' outcomes
by the state rounds in which they average their parameters (worker/strategy/outcomes.py): rounds that
averaged read ``averaged`` with their group's size, not ``failed`` as when only gradient rounds were seen.
Peers are ``tests.programs.swarm_peer`` processes in their own process groups, always killed at the end.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import ProcessRegistry
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(300)]
INITIAL_PEERS_LINE = re.compile(r"^INITIAL_PEERS=(\S+)$", re.MULTILINE)
AVERAGE_STATE_EVERY = 2  # a state round every other epoch: the epochs between are not rounds
ROUNDS_AVERAGED = 2


def _status(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def test_local_sync_peers_count_their_state_rounds_as_averaged(tmp_path: Path) -> None:
    registry = ProcessRegistry(tmp_path)
    statuses = {name: tmp_path / f"{name}.json" for name in ("a", "b")}
    try:
        peers = {}
        for name in ("a", "b"):
            wait = ["--wait-file", str(tmp_path / "b_peers")] if name == "b" else []
            args = [
                sys.executable,
                "-m",
                "tests.programs.swarm_peer",
                *("--status", str(statuses[name]), "--snapshots", str(tmp_path / f"{name}_params")),
                *("--stop", str(tmp_path / "stop"), "--seed", str(ord(name))),
                *("--sync", "local", "--average-state-every", str(AVERAGE_STATE_EVERY)),
                *wait,
            ]
            env = {"INITIAL_PEERS": "", "PL_INITIAL_PEERS": ""}
            peers[name] = registry.start(name, args, env=env, preloaded=True)
        match = wait_until(
            lambda: INITIAL_PEERS_LINE.search(peers["a"].log()), 90, message="a logs INITIAL_PEERS"
        )
        (tmp_path / "b_peers").write_text(match.group(1))
        wait_until(
            lambda: all(
                ((_status(path).get("averaging") or {}).get("averaged", 0)) >= ROUNDS_AVERAGED
                for path in statuses.values()
            ),
            120,
            message=lambda: (
                f"both peers average {ROUNDS_AVERAGED} state rounds: "
                f"{[_status(p).get('averaging') for p in statuses.values()]}"
            ),
        )
        (tmp_path / "stop").touch()
        for name, process in peers.items():
            wait_until(lambda process=process: not process.alive(), 45, message=f"{name} exits")
        for path in statuses.values():
            status = _status(path)
            counts = status["averaging"]
            assert counts["group_size_sum"] == 2 * counts["averaged"], counts  # groups of the two peers
            stepped = status["epochs"][-1]["epoch"] - status["joined_epoch"]
            rounds = sum(counts[k] for k in ("averaged", "no_group", "timeout", "failed"))
            # one outcome per state round, at most one round every AVERAGE_STATE_EVERY epochs (+ the edges)
            assert rounds <= stepped // AVERAGE_STATE_EVERY + 1, (counts, stepped)
    finally:
        registry.kill_all()
