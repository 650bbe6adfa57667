"""`spotswarm demo` (what `make demo` runs) stops on Ctrl-C, quietly (no line that reads as a crash), and
leaves nothing running, workers included.

The demo runs in its own process group, as a terminal's foreground job; Ctrl-C is SIGINT to that group
(its local workers run in sessions of their own, so the terminal's Ctrl-C does not reach them). Before
the stop the test takes a snapshot of the demo's family (descendants, workers included, and its process
group, each PID with its start time); afterwards none of them may run, and no process adopted by init
(parent PID 1) may carry this test's environment marker. Whatever a failing test leaves, the
``loop_data_dir`` fixture kills (the demo's workers included).

Not in the swarm lane: the demo's one worker averages with no one, and the stop's bounds are those of a
server's and a worker's own exit, which hold at the other lane's low priority as the server's own Ctrl-C
tests there do (``tests/integration/test_clean_exits.py``).
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from pathlib import Path

import httpx
import pytest

from orchestrator.cli.demo import DEMO_RUN, STOP_WAIT_S
from orchestrator.config import Settings
from tests.support import api
from tests.support.ports import free_port
from tests.support.processes import (
    VENV_BIN,
    ManagedProcess,
    ProcessRegistry,
    assert_family_ends,
    command_line,
    process_family,
)
from tests.support.waiting import BOOT_S, wait_until

DEMO_BOOT_S = BOOT_S + 60  # the server and its import probe first, then a worker
SHUTDOWN_GRACE_S = Settings().shutdown_grace_s
REAP_S = 5.0  # for the kernel to end what was signalled, and torch's shm manager (2 s after its clients)
MARKER = "SPOTSWARM_TEST_DEMO_EXITS"
PROMPT_STOP_S = 30.0  # a worker's leave and the server's stop, with room for a busy machine
# What reads as a crash after a clean Ctrl-C: an error or traceback, the DHT peer stopped the hard way,
# the reconcile loop "losing" the leadership it gave up on purpose.
CRASH_WORDS = re.compile(r"ERROR|CRITICAL|Traceback|the hard way|leadership lost|killed \d+ process")


def start_demo(processes: ProcessRegistry, data_dir: Path, marker: str) -> tuple[ManagedProcess, str]:
    port = free_port()
    args = ["demo", "--data-dir", str(data_dir), "--port", str(port), "--dht-port", str(free_port())]
    demo = processes.start(
        "demo",
        [str(VENV_BIN / "spotswarm"), *args, "--workers", "1"],
        env={MARKER: marker, "SPOTSWARM_WORKER_ENV": MARKER},
    )
    return demo, f"http://127.0.0.1:{port}"


def training_workers(demo: ManagedProcess, url: str) -> int:
    """Workers that contributed samples: past their start (registered, in the swarm), so a stop finds
    them training, not joining the swarm while the demo's own DHT peer goes."""
    if not demo.alive():
        pytest.fail(f"the demo exited with {demo.popen.returncode}:\n{demo.log()[-3000:]}")
    workers = httpx.get(url + api.run_workers(DEMO_RUN), timeout=10).raise_for_status().json()
    return sum(1 for w in workers["items"] if w["state"] == "running" and w["samples"] > 0)


def demo_with_a_worker(
    processes: ProcessRegistry, data_dir: Path, marker: str
) -> tuple[ManagedProcess, dict[int, int]]:
    """A demo whose worker trains, and its family (see the module docstring) taken then."""
    demo, url = start_demo(processes, data_dir, marker)
    wait_until(
        lambda: training_workers(demo, url) >= 1, DEMO_BOOT_S, interval_s=1, message="a demo worker trains"
    )
    family = process_family(demo.pid)
    assert [line for line in map(command_line, family) if "worker.agent" in line], family
    return demo, family


@pytest.mark.timeout(480)
def test_ctrl_c_stops_the_run_then_everything(processes: ProcessRegistry, loop_data_dir: Path) -> None:
    marker = uuid.uuid4().hex
    demo, family = demo_with_a_worker(processes, loop_data_dir, marker)

    os.killpg(demo.pid, signal.SIGINT)
    sent = time.monotonic()
    assert_family_ends(family, MARKER, marker, STOP_WAIT_S + SHUTDOWN_GRACE_S + REAP_S)
    assert demo.popen.wait(timeout=REAP_S) == 0
    took_s = time.monotonic() - sent
    assert took_s < PROMPT_STOP_S, f"the demo took {took_s:.0f} s to stop"
    assert demo.log().rstrip().endswith("stopped.")
    stop_output = demo.log().split("loss", 1)[-1]  # from the first progress line on
    assert not CRASH_WORDS.findall(stop_output), stop_output
    worker_logs = " ".join(log.read_text() for log in (loop_data_dir / "workers").glob("*.log"))
    assert "deregistered: stopped (the orchestrator asked this worker to stop)" in worker_logs


@pytest.mark.timeout(480)
def test_a_second_ctrl_c_ends_everything_at_once(processes: ProcessRegistry, loop_data_dir: Path) -> None:
    marker = uuid.uuid4().hex
    demo, family = demo_with_a_worker(processes, loop_data_dir, marker)

    os.killpg(demo.pid, signal.SIGINT)
    wait_until(lambda: "stopping the demo run" in demo.log(), 10, message="the first Ctrl-C is taken")
    os.killpg(demo.pid, signal.SIGINT)
    assert_family_ends(family, MARKER, marker, REAP_S)
    assert demo.popen.wait(timeout=REAP_S) == 130
    assert "a second Ctrl-C: killed" in demo.log()
