"""A peer killed without leaving (``kill -9``, a spot reclaim whose notice never came) is forgotten soon.

Its last progress record stays in the DHT until it expires. While it does, its epoch is the swarm's: a
peer behind it downloads state at every step (hivemind's catch-up) from peers no further than itself,
and trains nothing. With hivemind's 60 s expiration that was a minute of a swarm standing still; the
strategy's default (``worker.strategy.tracker.METADATA_EXPIRATION_S``) bounds it.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hivemind
import pytest

from tests.support.processes import ManagedProcess, ProcessRegistry
from tests.support.waiting import wait_until
from worker.strategy.tracker import METADATA_EXPIRATION_S

pytestmark = pytest.mark.swarm

#: the dead peer's epochs: ahead of a peer that joins after it died
EPOCHS_AHEAD = 5
#: the joining peer's wait after the death, at most: the expiration, plus a fetch of the progress
#: records (every 10 s at the most) and a busy machine's slack; hivemind's 60 s cannot pass this
RESUMED_WITHIN_S = METADATA_EXPIRATION_S + 20.0


@pytest.fixture
def bootstrap() -> Iterator[hivemind.DHT]:
    """A DHT peer that outlives the others, as the orchestrator's does: the joining peer's way in."""
    dht = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    try:
        yield dht
    finally:
        dht.shutdown()


def _start_peer(processes: ProcessRegistry, root: Path, name: str) -> tuple[ManagedProcess, Path]:
    """A digits peer that waits for its peers file; every local step (of 32 samples) is a swarm epoch."""
    status = root / f"{name}.json"
    args = [
        sys.executable,
        "-m",
        "tests.programs.swarm_peer",
        *("--status", str(status), "--snapshots", str(root / f"{name}_params")),
        *("--stop", str(root / "stop"), "--wait-file", str(root / f"{name}_peers")),
        *("--target-batch-size", "32", "--batch-size", "32", "--max-seconds", "120"),
    ]
    env = {"INITIAL_PEERS": "", "PL_INITIAL_PEERS": ""}
    return processes.start(name, args, env=env, preloaded=True), status


def _status(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


@pytest.mark.timeout(180)
def test_a_peer_behind_a_killed_one_trains_again_once_its_record_expires(
    processes: ProcessRegistry, tmp_path: Path, bootstrap: hivemind.DHT
) -> None:
    ahead, ahead_status = _start_peer(processes, tmp_path, "ahead")
    behind, behind_status = _start_peer(processes, tmp_path, "behind")  # imports meanwhile
    maddrs = ",".join(str(m) for m in bootstrap.get_visible_maddrs())
    (tmp_path / "ahead_peers").write_text(maddrs)
    wait_until(
        lambda: any(e["epoch"] >= EPOCHS_AHEAD for e in _status(ahead_status).get("epochs", [])),
        90,
        message=f"the first peer trains {EPOCHS_AHEAD} epochs alone",
    )
    ahead.kill()  # SIGKILL to its process group: its DHT and p2pd too, no record withdrawn
    killed_at = time.time()
    dead_epoch = max(e["epoch"] for e in _status(ahead_status)["epochs"])

    (tmp_path / "behind_peers").write_text(maddrs)
    wait_until(
        lambda: _status(behind_status).get("phase") == "training",
        60,
        message="the second peer joins (finding no live peer to download from)",
    )
    assert _status(behind_status)["joined_epoch"] < dead_epoch, "it joined behind the dead peer"
    epochs = wait_until(
        lambda: [e for e in _status(behind_status).get("epochs", []) if e["epoch"] >= 1],
        RESUMED_WITHIN_S + 30,
        message="the second peer ends an epoch",
    )
    waited_s = epochs[0]["time"] - killed_at
    assert waited_s < RESUMED_WITHIN_S, (
        f"the second peer stood still {waited_s:.0f} s after the death of a peer at epoch {dead_epoch}"
    )
    assert behind.alive()
