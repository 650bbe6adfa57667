"""`spotswarm serve` stops within its stop grace and leaves no process of its own behind.

Each test starts the real command (SQLite, the default configuration but for fast ticks), waits until the
forked DHT peer, its p2pd and the fork server (which runs the import check) run, takes a snapshot of the
server's family (its descendants and its process group, each PID with its start time), stops it the way
users do, and then asserts that no process of that snapshot runs any more and that no process adopted by
init (parent PID 1) carries this test's environment marker.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
import uuid
from pathlib import Path

import pytest

from orchestrator.config import Settings
from tests.support.orchestrator import Orchestrator, start_orchestrator
from tests.support.ports import free_port
from tests.support.processes import (
    REPO_ROOT,
    VENV_BIN,
    ProcessRegistry,
    assert_family_ends,
    command_line,
    orphans_with_env,
    process_family,
)
from tests.support.waiting import wait_until

SHUTDOWN_GRACE_S = Settings().shutdown_grace_s  # the default users get
REAP_S = 5.0  # for the kernel to end and reap what the stop signalled (not part of the product's grace)
MARKER = "SPOTSWARM_TEST_EXITS"
STALE_PEER_SCRIPT = REPO_ROOT / "tests" / "programs" / "stale_dht_peer.py"


def start(processes: ProcessRegistry, data_dir: Path, marker: str, **kwargs: object) -> Orchestrator:
    """A server exec'd as users start it (not forked preloaded): these tests are about its process, the
    signal dispositions it inherits and the environment marker ``/proc`` shows for it and its children."""
    env = {MARKER: marker, "SPOTSWARM_WORKER_ENV": MARKER}  # the fork server gets the marker too
    return start_orchestrator(processes, data_dir, extra_env=env, preloaded=False, **kwargs)  # type: ignore[arg-type]


def full_family(orch: Orchestrator) -> dict[int, int]:
    """The server's family once its DHT peer, the peer's p2pd and the fork server (the import check's)
    all run."""

    def complete() -> dict[int, int] | None:
        family = process_family(orch.proc.pid)
        names = " ".join(command_line(pid) for pid in family)
        has_probe = "orchestrator.launchers.forkserver_main" in names
        has_dht = sum("spotswarm serve" in command_line(pid) for pid in family) >= 2  # server + its fork
        return family if has_probe and has_dht and "p2pd" in names else None

    return wait_until(complete, 120, message="the DHT peer, p2pd and the fork server run")


def dht_pid(orch: Orchestrator) -> int:
    """The PID of the server's DHT peer: its forked child with the same command line."""
    forks = [pid for pid in process_family(orch.proc.pid) if pid != orch.proc.pid]
    return next(pid for pid in forks if "spotswarm serve" in command_line(pid))


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("sig", "to_group", "exit_code", "sigint_ignored"),
    [
        (signal.SIGTERM, False, -signal.SIGTERM, False),  # `kill <pid>`: uvicorn re-raises it when done
        (signal.SIGTERM, True, -signal.SIGTERM, False),  # `kill -- -<pgid>`, a container runtime, a harness
        (signal.SIGINT, True, 130, False),  # Ctrl-C in a terminal: the whole foreground process group
        # started with SIGINT ignored (`spotswarm serve &` in a script): uvicorn still stops on it, and
        # re-raising it when done does nothing there, so the exit status must not depend on that
        (signal.SIGINT, True, 130, True),
    ],
    ids=["sigterm-pid", "sigterm-group", "ctrl-c", "ctrl-c-sigint-ignored-at-start"],
)
def test_stop_leaves_no_process_within_the_grace(
    processes: ProcessRegistry,
    tmp_path: Path,
    sig: signal.Signals,
    to_group: bool,
    exit_code: int,
    sigint_ignored: bool,
) -> None:
    marker = uuid.uuid4().hex
    # the server inherits SIGINT ignored, or the default (a handler of ours is reset at exec), whatever
    # this test process was started with
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN if sigint_ignored else signal.default_int_handler)
    try:
        orch = start(processes, tmp_path / "orch", marker)
    finally:
        signal.signal(signal.SIGINT, previous)
    family = full_family(orch)
    if to_group:
        os.killpg(orch.proc.pid, sig)
    else:
        os.kill(orch.proc.pid, sig)
    assert_family_ends(family, MARKER, marker, SHUTDOWN_GRACE_S + REAP_S)
    assert orch.proc.popen.wait(timeout=REAP_S) == exit_code
    assert "orchestrator stopped" in orch.proc.log()
    # quietly: a stop asked for is no error (the DHT peer's p2pd no longer takes the group's signal)
    assert not re.findall(r"ERROR|Traceback|the hard way", orch.proc.log()), orch.proc.log()[-3000:]


@pytest.mark.timeout(240)
def test_a_killed_server_takes_its_dht_peer_with_it(processes: ProcessRegistry, tmp_path: Path) -> None:
    """`kill -9 <pid>`: no shutdown code runs, yet the kernel ends the DHT peer, which ends its p2pd."""
    marker = uuid.uuid4().hex
    orch = start(processes, tmp_path / "orch", marker)
    family = full_family(orch)
    os.kill(orch.proc.pid, signal.SIGKILL)
    assert_family_ends(family, MARKER, marker, REAP_S)


@pytest.mark.timeout(240)
def test_a_dht_peer_left_by_a_crashed_server_is_stopped_at_the_next_start(
    processes: ProcessRegistry, tmp_path: Path
) -> None:
    """A peer left running (as servers before this fix left theirs) holds the data dir's DHT port and
    identity: the next server on that data dir stops it and starts on the same port."""
    marker = uuid.uuid4().hex
    data_dir = tmp_path / "orch"
    data_dir.mkdir()
    crashed = processes.start(
        "crashed", [sys.executable, str(STALE_PEER_SCRIPT), str(data_dir)], env={MARKER: marker}
    )
    wait_until(lambda: not crashed.alive() and "stale peer" in crashed.log(), 120, message="peer left")
    stale_pid, dht_port = (int(word) for word in crashed.log().split()[-2:])
    assert stale_pid in orphans_with_env(MARKER, marker)

    orch = start(processes, data_dir, marker, dht_port=dht_port)
    assert stale_pid not in orphans_with_env(MARKER, marker)
    assert f"a DHT peer (pid {stale_pid}) left by an orchestrator that ended" in orch.proc.log()
    assert orch.peers() and all(f"/tcp/{dht_port}/" in maddr for maddr in orch.peers())


@pytest.mark.timeout(240)
def test_a_second_server_on_a_data_dir_in_use_refuses_to_start(
    processes: ProcessRegistry, tmp_path: Path
) -> None:
    marker = uuid.uuid4().hex
    first = start(processes, tmp_path / "orch", marker)
    env = {"SPOTSWARM_DATA_DIR": str(first.data_dir), "SPOTSWARM_PORT": str(free_port()), MARKER: marker}
    # only its refusal is checked (its line, its exit code): forked preloaded
    second = processes.start("second", [str(VENV_BIN / "spotswarm"), "serve"], env=env, preloaded=True)
    wait_until(lambda: not second.alive(), 60, message="the second server exits")
    assert second.popen.returncode == 1
    message = f"Error: the DHT peer (pid {dht_pid(first)}) of another orchestrator (pid {first.proc.pid})"
    assert message in second.log() and "Traceback" not in second.log(), second.log()[-2000:]
    assert first.peers()  # the first one and its DHT peer are untouched


@pytest.mark.timeout(120)
@pytest.mark.parametrize("taken", ["SPOTSWARM_PORT", "SPOTSWARM_DHT_PORT"])
def test_a_server_whose_port_is_taken_refuses_to_start_with_one_line(
    processes: ProcessRegistry, tmp_path: Path, taken: str
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        ports = {"SPOTSWARM_PORT": str(free_port()), "SPOTSWARM_DHT_PORT": str(free_port()), taken: str(port)}
        env = {
            "SPOTSWARM_DATA_DIR": str(tmp_path / "orch"),
            "SPOTSWARM_HOST": "127.0.0.1",
            "SPOTSWARM_DHT_HOST_MADDRS": f"/ip4/127.0.0.1/tcp/{ports['SPOTSWARM_DHT_PORT']}",
            **ports,
        }
        server = processes.start("server", [str(VENV_BIN / "spotswarm"), "serve"], env=env, preloaded=True)
        log = server.wait_for_exit(60, "the server")
    assert server.popen.returncode == 1, log[-2000:]
    assert f"Error: 127.0.0.1:{port} " in log and "in use" in log, log[-2000:]
    assert "Traceback" not in log, log[-2000:]
