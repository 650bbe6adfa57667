"""What a peer leaves in the DHT: its progress record, withdrawn by hivemind's goodbye unless the run is done.

Every worker of a run that reached its target leaves at about the same moment. If each one withdrew its
record, the orchestrator's reading at their deregistration (and any later one) would find no progress,
never see the final epoch, and relaunch workers for a run that is finished. So a peer that leaves
because the run reached its target keeps its last record until it expires.

Each case trains in a fresh interpreter (``tests/programs/leaving_peer.py`` says why).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.processes import VENV_BIN, ProcessRegistry
from tests.support.waiting import wait_until

STEPS = 4
RUN_S = 150


def entries_after_fit(processes: ProcessRegistry, mode: str) -> list[Any]:
    """The values of the run's progress entries the peer's DHT holds once its fit has ended."""
    peer = processes.start(
        f"leaving-{mode}",
        [str(VENV_BIN / "python"), "-m", "tests.programs.leaving_peer", mode, str(STEPS)],
    )
    wait_until(lambda: not peer.alive(), RUN_S, interval_s=0.2, message=f"the {mode} peer ends")
    assert peer.popen.returncode == 0, peer.log()[-3000:]
    [line] = [line for line in peer.log().splitlines() if line.startswith('{"entries"')]
    return json.loads(line)["entries"]


@pytest.mark.timeout(180)
def test_a_peer_leaving_a_run_at_its_target_keeps_its_last_progress_record(
    processes: ProcessRegistry,
) -> None:
    [entry] = entries_after_fit(processes, "keep")
    assert entry is not None and entry["epoch"] == STEPS


@pytest.mark.timeout(180)
def test_a_peer_leaving_otherwise_withdraws_its_progress_record(processes: ProcessRegistry) -> None:
    assert entries_after_fit(processes, "withdraw") == [None]
