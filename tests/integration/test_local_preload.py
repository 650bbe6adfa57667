"""Local workers forked from the launcher's fork server (the default): the real worker agent, started
the way a plain launch starts it, seen from ``/proc`` as the launcher, the server's stop and the tests
see plain workers. The agent is pointed at a closed port, so it keeps retrying its registration (a live
worker) until it is told to stop, or exits at once without a join token."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.launchers.base import LaunchRequest
from orchestrator.launchers.forkserver import ForkServer
from orchestrator.launchers.local import LAUNCH_MARKER_ENV, LocalLauncher
from orchestrator.launchers.local_files import processes_with_marker
from orchestrator.processes import descendants, stat_fields
from tests.support.processes import REPO_ROOT, command_line
from tests.support.waiting import wait_until


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def registering(request_id: str) -> LaunchRequest:
    """A worker that retries its registration for a minute (nothing listens on its orchestrator URL)."""
    env = {
        "SPOTSWARM_URL": f"http://127.0.0.1:{closed_port()}",
        "SPOTSWARM_JOIN_TOKEN": "ssj_none",
        "SPOTSWARM_REQUEST_ID": request_id,
        "SPOTSWARM_REGISTER_TIMEOUT_S": "60",
    }
    return LaunchRequest(request_id=request_id, run_name="demo", env=env)


def environ_of(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


def instance_of(launcher: LocalLauncher, request_id: str):
    return next(i for i in launcher.describe() if i.request_id == request_id)


#: between SIGTERM and SIGKILL: an agent told to stop while it retries its registration leaves once
#: its current call's retries are spent (about 7 s)
GRACE_S = 15.0


@contextlib.contextmanager
def running_launcher(data_dir: Path) -> Iterator[LocalLauncher]:
    """A local launcher (with its fork server); at the end its live workers are killed by group."""
    launcher = LocalLauncher(data_dir, grace_s=GRACE_S)
    try:
        yield launcher
    finally:
        for instance in launcher.describe():
            if instance.alive:
                os.killpg(int(instance.handle), signal.SIGKILL)
        launcher.close()


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory):
    """One launcher (and fork server) for the tests that launch with distinct request ids."""
    with running_launcher(tmp_path_factory.mktemp("preload") / "data") as launcher:
        yield launcher


@pytest.mark.timeout(90)
def test_a_preloaded_worker_is_a_supervisor_and_the_agent_marked_and_stopped_like_a_plain_one(
    launcher: LocalLauncher,
) -> None:
    handle = launcher.launch(registering("req-a"))
    supervisor = int(handle)
    worker = wait_until(lambda: descendants(supervisor), 10, message="the supervisor forked the worker")[0]
    fields = stat_fields(supervisor)  # it leads its process group and its session
    assert fields is not None and (int(fields[2]), int(fields[3])) == (supervisor, supervisor)
    marker = f"{LAUNCH_MARKER_ENV}=req-a".encode()
    assert marker in environ_of(supervisor) and marker in environ_of(worker)
    assert sorted(processes_with_marker(LAUNCH_MARKER_ENV, "req-a")) == sorted(
        [(supervisor, supervisor), (worker, supervisor)]
    )
    plain = f"{sys.executable} -m worker.agent"  # the worker rewrites its command line as it starts
    wait_until(lambda: command_line(worker) == plain, 10, message=f"{command_line(worker)!r} reads {plain!r}")
    assert command_line(supervisor) == "spotswarm-supervisor req-a"
    log = Path(instance_of(launcher, "req-a").details["log_path"])
    wait_until(lambda: "will retry registering" in log.read_text(), 30, message=log.name)

    launcher.terminate("req-a")  # SIGTERM to the group: the agent leaves, the supervisor records how
    gone = wait_until(lambda: (i := instance_of(launcher, "req-a")) and not i.alive and i, GRACE_S - 1)
    exit_file = log.parent.parent / "launcher-local" / "req-a.exit"
    assert gone.details["exit_code"] == int(exit_file.read_text()) == 0
    assert [f for f in launcher.poll_errors() if f.request_id == "req-a"] == []  # asked for: no failure
    assert processes_with_marker(LAUNCH_MARKER_ENV, "req-a") == []


@pytest.mark.timeout(90)
def test_a_preloaded_worker_killed_with_its_group_is_a_retryable_failure(launcher: LocalLauncher) -> None:
    supervisor = int(launcher.launch(registering("req-k")))
    wait_until(lambda: descendants(supervisor), 10, message="the supervisor forked the worker")
    os.killpg(supervisor, signal.SIGKILL)
    failures = wait_until(lambda: [f for f in launcher.poll_errors() if f.request_id == "req-k"], 10)
    assert [(f.request_id, f.retryable) for f in failures] == [("req-k", True)]
    assert "was killed by SIGKILL" in failures[0].reason


@pytest.mark.timeout(90)
def test_an_agent_killed_by_hand_is_named_by_its_own_pid(launcher: LocalLauncher) -> None:
    """A person kills the agent they see in ``ps`` (``python -m worker.agent``); the failure, which
    becomes the worker's end reason and event, names that PID, not its supervisor's."""
    supervisor = int(launcher.launch(registering("req-p")))
    agent = wait_until(lambda: descendants(supervisor), 10, message="the supervisor forked the worker")[0]
    instance_of(launcher, "req-p")  # a reconcile tick reads the launcher's view (and so learns the agent)
    os.kill(agent, signal.SIGKILL)
    failures = wait_until(lambda: [f for f in launcher.poll_errors() if f.request_id == "req-p"], 10)
    assert f"worker req-p (pid {agent}) was killed by SIGKILL" in failures[0].reason
    assert str(supervisor) not in failures[0].reason


@pytest.mark.timeout(90)
def test_a_preloaded_worker_without_a_join_token_fails_for_good_with_its_log(launcher: LocalLauncher) -> None:
    request = registering("req-u")
    del request.env["SPOTSWARM_JOIN_TOKEN"]
    launcher.launch(request)
    failures = wait_until(lambda: [f for f in launcher.poll_errors() if f.request_id == "req-u"], 30)
    assert [(f.request_id, f.retryable) for f in failures] == [("req-u", False)]
    assert "exited with code 2" in failures[0].reason and "--join-token" in failures[0].reason


@pytest.mark.timeout(120)
def test_preloaded_workers_outlive_their_launcher_and_a_new_one_adopts_them(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = LocalLauncher(data, grace_s=GRACE_S)
    supervisor = int(first.launch(registering("req-o")))
    worker = wait_until(lambda: descendants(supervisor), 10, message="the supervisor forked the worker")[0]
    first.close()  # the fork server ends with its launcher (and with its server)
    try:
        assert stat_fields(supervisor) is not None and stat_fields(worker) is not None
        second = LocalLauncher(data, grace_s=GRACE_S)
        adopted = instance_of(second, "req-o")
        assert adopted.alive and adopted.handle == str(supervisor)
        second.terminate("req-o")
        gone = wait_until(lambda: (i := instance_of(second, "req-o")) and not i.alive and i, GRACE_S - 1)
        assert gone.details["exit_code"] == 0  # from the exit file its supervisor wrote
        second.close()
    finally:
        if stat_fields(supervisor) is not None:
            os.killpg(supervisor, signal.SIGKILL)


@pytest.mark.timeout(90)
def test_a_worker_whose_environment_differs_from_the_fork_servers_starts_in_a_fresh_interpreter(
    launcher: LocalLauncher, monkeypatch: pytest.MonkeyPatch
) -> None:
    launcher.launch(registering("req-p"))  # the fork server runs with the environment it started with
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # read when torch loads: a preloaded worker cannot take it
    supervisor = int(launcher.launch(registering("req-f")))
    # the supervisor shell of a plain start; its arguments show a moment after its exec has let Popen
    # return (read at once on a busy machine, they were still empty)
    shell = wait_until(lambda: command_line(supervisor), 10, message="the supervisor's command line")
    assert shell.startswith("sh -c"), shell
    worker = wait_until(lambda: descendants(supervisor), 10, message="the shell started the worker")[0]
    assert b"OMP_NUM_THREADS=3" in environ_of(worker)


@pytest.mark.timeout(120)
def test_a_worker_killed_holding_hiveminds_lock_leaves_the_next_preloaded_workers_dht_free(
    tmp_path: Path,
) -> None:
    """hivemind's inter-process locks are made when the fork server imports hivemind; each forked worker
    needs its own, or one killed while it holds one (hivemind takes one for every future it creates)
    blocks the DHT start of every worker forked after it."""
    forkserver = ForkServer(dict(os.environ), REPO_ROOT, log_path=tmp_path / "forkserver.log")
    exits: dict[int, int] = {}
    forkserver.watch_exits(exits.__setitem__)

    def start(role: str) -> tuple[int, Path]:
        log = tmp_path / f"{role}.log"
        request = {
            "request_id": role,
            "env": {**os.environ, "PRELOADED_ROLE": role},
            "cwd": str(REPO_ROOT),
            "log_path": str(log),
            "exit_path": str(tmp_path / f"{role}.exit"),
            "module": "tests.programs.preloaded_lock_holder",
            "marker": f"{LAUNCH_MARKER_ENV}={role}",
        }
        return forkserver.start_worker(request), log

    started: list[int] = []
    try:
        holder, holder_log = start("hold")
        started.append(holder)
        wait_until(lambda: "holding" in holder_log.read_text(), 30, message="the worker holds the lock")
        os.killpg(holder, signal.SIGKILL)
        wait_until(lambda: holder in exits, 10, message="the fork server reports the killed worker")
        peer, peer_log = start("dht")
        started.append(peer)
        wait_until(lambda: peer in exits, 45, message="the next worker's DHT starts and it exits")
        assert (exits[peer], peer_log.read_text().splitlines()[-1]) == (0, "dht ready")
    finally:
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        forkserver.close()
