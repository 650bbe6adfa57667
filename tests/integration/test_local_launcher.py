"""The local launcher with real subprocesses: a tiny fake worker script stands in for the agent."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from orchestrator.launchers.base import Launcher, LaunchRequest
from orchestrator.launchers.local import LocalLauncher
from tests.support.processes import ProcessRegistry
from tests.support.waiting import holds_for, wait_until

FAKE_WORKER = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    mode = os.environ["FAKE_MODE"]
    start_cwd = os.getcwd()
    os.chdir(os.environ["SPOTSWARM_WORKER_DIR"])  # set by the launcher
    with open("started", "a") as f:
        f.write(f"{os.getpid()} {os.environ.get('SPOTSWARM_REQUEST_ID')} {start_cwd}\\n")
    print("fake worker up", flush=True)
    if mode.startswith("exit:"):
        print("loading module...", flush=True)
        print("last words: ImportError: no module named nowhere", flush=True)
        sys.exit(int(mode.split(":")[1]))
    if mode == "grandchild":
        child = subprocess.Popen(["sleep", "600"])
        with open("grandchild", "w") as f:
            f.write(str(child.pid))
    if mode == "ignore_term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with open("ignoring", "w") as f:
            f.write("1")
    time.sleep(600)
    """
)


@pytest.fixture
def fake_command(tmp_path: Path) -> list[str]:
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    return [sys.executable, str(script)]


def request(request_id: str, mode: str) -> LaunchRequest:
    return LaunchRequest(
        request_id=request_id,
        run_name="demo",
        env={"FAKE_MODE": mode, "SPOTSWARM_REQUEST_ID": request_id},
    )


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def started_pids(worker_dir: Path) -> list[int]:
    path = worker_dir / "started"
    return [int(line.split()[0]) for line in path.read_text().splitlines()] if path.exists() else []


def instance_of(launcher: LocalLauncher, request_id: str):
    return next(i for i in launcher.describe() if i.request_id == request_id)


@pytest.mark.timeout(30)
def test_launch_is_idempotent_and_logs_to_the_data_dir(tmp_path: Path, fake_command: list[str]) -> None:
    launcher = LocalLauncher(tmp_path / "data", fake_command, cwd=tmp_path, grace_s=2.0)
    assert isinstance(launcher, Launcher)
    worker_dir = tmp_path / "data" / "workers" / "req-1"
    try:
        handle = launcher.launch(request("req-1", "sleep"))
        assert launcher.launch(request("req-1", "sleep")) == handle
        wait_until(lambda: started_pids(worker_dir), 10, message="fake worker wrote its pid")
        log = tmp_path / "data" / "workers" / "req-1.log"
        wait_until(lambda: "fake worker up" in log.read_text(), 10, message="worker output in its log")
        _, request_id, cwd = (worker_dir / "started").read_text().split()
        assert request_id == "req-1"  # the request's env arrived
        assert cwd == str(tmp_path)  # the launcher's cwd: user modules import from there
        instance = instance_of(launcher, "req-1")
        assert instance.alive and instance.handle == handle and instance.run_name == "demo"
        assert len(started_pids(worker_dir)) == 1
    finally:
        launcher.terminate("req-1")
    wait_until(lambda: not instance_of(launcher, "req-1").alive, 10, message="terminated worker gone")
    assert len(started_pids(worker_dir)) == 1


@pytest.mark.timeout(30)
def test_terminate_kills_the_whole_group_and_reports_no_error(
    tmp_path: Path, fake_command: list[str]
) -> None:
    launcher = LocalLauncher(tmp_path / "data", fake_command, grace_s=5.0)
    launcher.launch(request("req-g", "grandchild"))
    marker = tmp_path / "data" / "workers" / "req-g" / "grandchild"
    wait_until(marker.exists, 10, message="grandchild started")
    grandchild = int(marker.read_text())
    worker = started_pids(marker.parent)[0]
    launcher.terminate("req-g")
    wait_until(lambda: not pid_alive(worker) and not pid_alive(grandchild), 10, message="group gone")
    instance = wait_until(lambda: (i := instance_of(launcher, "req-g")) and not i.alive and i, 5)
    assert instance.details["exit_code"] == 128 + signal.SIGTERM
    assert instance.details["terminating"] is True
    assert launcher.poll_errors() == []  # stopping a worker on request is not a failure


@pytest.mark.timeout(30)
def test_terminate_escalates_to_sigkill_without_blocking(tmp_path: Path, fake_command: list[str]) -> None:
    launcher = LocalLauncher(tmp_path / "data", fake_command, grace_s=0.5)
    launcher.launch(request("req-stubborn", "ignore_term"))
    worker_dir = tmp_path / "data" / "workers" / "req-stubborn"
    wait_until((worker_dir / "ignoring").exists, 10, message="worker ignores SIGTERM")
    worker = started_pids(worker_dir)[0]
    began = time.monotonic()
    launcher.terminate("req-stubborn")
    assert time.monotonic() - began < 0.3
    # well inside the grace period: SIGTERM alone must not stop it
    holds_for(lambda: pid_alive(worker), 0.2, message="the worker ignoring SIGTERM stays alive")
    wait_until(lambda: not pid_alive(worker), 10, message="SIGKILL after the grace period")
    wait_until(lambda: not instance_of(launcher, "req-stubborn").alive, 5)


@pytest.mark.timeout(30)
def test_failed_exits_are_reported_once_with_log_tail(tmp_path: Path, fake_command: list[str]) -> None:
    data = tmp_path / "data"
    launcher = LocalLauncher(data, fake_command)
    launcher.launch(request("req-crash", "exit:1"))
    launcher.launch(request("req-config", "exit:3"))
    launcher.launch(request("req-ok", "exit:0"))
    gone = lambda: all(not i.alive for i in launcher.describe())  # noqa: E731
    wait_until(gone, 10, message="all three exited")
    failures = {f.request_id: f for f in launcher.poll_errors()}
    assert set(failures) == {"req-crash", "req-config"}
    assert failures["req-crash"].retryable and not failures["req-config"].retryable
    assert "exited with code 1" in failures["req-crash"].reason
    assert "ImportError: no module named nowhere" in failures["req-config"].reason
    assert failures["req-crash"].run_name == "demo"
    assert launcher.poll_errors() == []
    # A restarted orchestrator neither reports them again nor launches them again.
    again = LocalLauncher(data, fake_command)
    assert again.poll_errors() == []
    again.launch(request("req-crash", "exit:1"))
    assert len(started_pids(data / "workers" / "req-crash")) == 1
    assert {i.request_id: i.details["exit_code"] for i in again.describe()} == {
        "req-crash": 1,
        "req-config": 3,
        "req-ok": 0,
    }


@pytest.mark.timeout(30)
def test_a_worker_killed_by_hand_is_named_by_its_own_pid(tmp_path: Path, fake_command: list[str]) -> None:
    """The plain launch (a supervisor shell): the failure names the PID of the process a person killed,
    the worker under the shell, not the shell's."""
    data = tmp_path / "data"
    launcher = LocalLauncher(data, fake_command)
    supervisor = int(launcher.launch(request("req-hand", "sleep")))
    try:
        [worker] = wait_until(lambda: started_pids(data / "workers" / "req-hand"), 10, message="it runs")
        instance_of(launcher, "req-hand")  # a reconcile tick reads the launcher's view: it learns the worker
        os.kill(worker, signal.SIGKILL)
        failures = wait_until(lambda: [f for f in launcher.poll_errors() if f.request_id == "req-hand"], 10)
    finally:
        with contextlib.suppress(ProcessLookupError):  # gone with its worker, unless the test failed first
            os.killpg(supervisor, signal.SIGKILL)
    assert f"worker req-hand (pid {worker}) was killed by SIGKILL" in failures[0].reason
    assert worker != supervisor and f"pid {supervisor}" not in failures[0].reason


LAUNCHER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from orchestrator.launchers.base import LaunchRequest
    from orchestrator.launchers.local import LocalLauncher
    launcher = LocalLauncher(Path(sys.argv[1]), sys.argv[2:])
    env = {"FAKE_MODE": "grandchild", "SPOTSWARM_REQUEST_ID": "req-a"}
    print("handle", launcher.launch(LaunchRequest("req-a", "demo", env)), flush=True)
    time.sleep(600)
    """
)


@pytest.mark.timeout(40)
def test_new_launcher_adopts_workers_after_orchestrator_kill_9(
    tmp_path: Path, fake_command: list[str], processes: ProcessRegistry
) -> None:
    data = tmp_path / "data"
    orchestrator = processes.start("orch", [sys.executable, "-c", LAUNCHER_SCRIPT, str(data), *fake_command])
    grandchild_file = data / "workers" / "req-a" / "grandchild"
    wait_until(grandchild_file.exists, 15, message="worker launched by the first orchestrator")
    handle = wait_until(lambda: "handle" in orchestrator.log() and orchestrator.log().split()[1], 5)
    orchestrator.kill()  # SIGKILL: no chance to clean up
    worker, grandchild = started_pids(grandchild_file.parent)[0], int(grandchild_file.read_text())
    assert pid_alive(worker) and pid_alive(grandchild)

    launcher = LocalLauncher(data, fake_command, grace_s=5.0)
    instance = instance_of(launcher, "req-a")
    assert instance.alive and instance.handle == handle
    assert launcher.launch(request("req-a", "grandchild")) == handle
    launcher.terminate("req-a")
    wait_until(lambda: not pid_alive(worker) and not pid_alive(grandchild), 10, message="adopted group gone")
    gone = wait_until(lambda: (i := instance_of(launcher, "req-a")) and not i.alive and i, 5)
    assert gone.details["exit_code"] == 128 + signal.SIGTERM  # known although it was not our child
    assert len(started_pids(grandchild_file.parent)) == 1


@pytest.mark.timeout(30)
def test_a_reused_pid_is_not_mistaken_for_a_worker(tmp_path: Path, fake_command: list[str]) -> None:
    data = tmp_path / "data"
    launcher = LocalLauncher(data, fake_command)
    launcher.launch(request("req-old", "exit:0"))
    wait_until(lambda: not instance_of(launcher, "req-old").alive, 10)
    # Pretend the kernel gave the dead worker's PID to an unrelated process (start time differs).
    stranger = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        state_file = data / "launcher-local" / "req-old.json"
        state = json.loads(state_file.read_text())
        state.update(pid=stranger.pid, gone_at=None, exit_code=None)
        state_file.write_text(json.dumps(state))
        (data / "launcher-local" / "req-old.exit").unlink()
        restarted = LocalLauncher(data, fake_command, grace_s=0.2)
        assert not instance_of(restarted, "req-old").alive
        restarted.terminate("req-old")
        # past the grace period: no SIGKILL may reach the stranger
        holds_for(lambda: stranger.poll() is None, 0.5, message="the stranger holding the PID lives on")
    finally:
        os.killpg(stranger.pid, signal.SIGKILL)
        stranger.wait()


@pytest.mark.timeout(30)
def test_workers_get_an_allow_listed_environment_without_the_servers_secrets(
    tmp_path: Path, fake_command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = {
        "SPOTSWARM_ADMIN_TOKEN": "ssa_not-for-workers",
        "SPOTSWARM_DATABASE_URL": "postgresql+psycopg://spotswarm:db-password@db/spotswarm",
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "SPOTSWARM_HEARTBEAT_TIMEOUT_S": "10",  # a server setting: none of a worker's business
    }
    kept = {
        "CUDA_VISIBLE_DEVICES": "1",
        "LC_ALL": "C.UTF-8",
        "SPOTSWARM_LOG_FORMAT": "json",  # a worker setting
        "DATASET_TOKEN": "named-by-the-admin",  # passed because the launcher was told to
    }
    for name, value in {**secrets, **kept}.items():
        monkeypatch.setenv(name, value)
    launcher = LocalLauncher(tmp_path / "data", fake_command, grace_s=2.0, pass_env=["DATASET_*"])
    worker_dir = tmp_path / "data" / "workers" / "req-env"
    try:
        launcher.launch(request("req-env", "sleep"))
        pids = wait_until(lambda: started_pids(worker_dir), 10, message="fake worker wrote its pid")
        raw = Path(f"/proc/{pids[0]}/environ").read_bytes().decode()
        environ = dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)
    finally:
        launcher.terminate("req-env")
    assert not set(secrets) & set(environ), sorted(set(secrets) & set(environ))
    assert {name: environ.get(name) for name in kept} == kept
    assert environ["PATH"] == os.environ["PATH"] and environ["SPOTSWARM_REQUEST_ID"] == "req-env"
    assert environ["SPOTSWARM_WORKER_DIR"] == str(worker_dir)
    log = tmp_path / "data" / "workers" / "req-env.log"
    assert (worker_dir.stat().st_mode & 0o777, log.stat().st_mode & 0o777) == (0o700, 0o600)  # owner-only
