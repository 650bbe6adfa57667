"""The CLI as people use it: connection options before or after the subcommand, ``--version``, defaults
and examples in ``--help``, validation errors in words (every one of them listed), ``runs delete`` and
``runs watch`` (in a pipe and on a terminal)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
from importlib.metadata import version
from pathlib import Path

import pytest

from orchestrator.cli.client import EXIT_CONFLICT, EXIT_ERROR, EXIT_NOT_FOUND, EXIT_UNREACHABLE
from tests.support import api
from tests.support.cli import HandWorker, cli
from tests.support.orchestrator import Orchestrator
from tests.support.ports import free_port
from tests.support.processes import VENV_BIN
from tests.support.specs import run_spec
from tests.support.waiting import wait_until
from worker.protocol.workers import DeregisterReason


def one_line_error(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


@pytest.mark.timeout(30)
def test_connection_options_work_before_and_after_the_subcommand(served_orch: Orchestrator) -> None:
    created = cli(
        served_orch, "runs", "create", "--json", "--file", "-", stdin=json.dumps(run_spec("global-opts"))
    )
    assert created.exit_code == 0, created.output
    before = cli(None, "--url", served_orch.url, "--token", served_orch.admin_token, "--json", "runs", "list")
    assert before.exit_code == 0, before.output
    assert [run["name"] for run in json.loads(before.stdout)["items"]] == ["global-opts"]
    after = cli(None, "runs", "list", "--url", served_orch.url, "--json")
    assert after.exit_code == 0 and json.loads(after.stdout)["items"][0]["name"] == "global-opts"
    dead = f"http://127.0.0.1:{free_port()}"
    command_wins = cli(None, "--url", dead, "runs", "show", "global-opts", "--url", served_orch.url)
    assert command_wins.exit_code == 0 and "run global-opts" in command_wins.stdout, command_wins.output
    group_used = cli(None, "--url", dead, "--timeout", "2", "runs", "list")
    assert group_used.exit_code == EXIT_UNREACHABLE and dead in one_line_error(group_used.stderr)


def test_version_comes_from_the_package_metadata() -> None:
    shown = cli(None, "--version")
    assert shown.exit_code == 0 and shown.stdout == f"spotswarm {version('spotswarm')}\n"


def test_help_shows_defaults_and_examples() -> None:
    create_help = " ".join(cli(None, "runs", "create", "--help").stdout.split())  # as wrapped for 80 columns
    for default in ("[default: 2]", "[default: 1]", "[default: 8]", "[default: 5]", "[default: local]"):
        assert default in create_help, default
    assert "Examples: spotswarm runs create --name digits" in create_help
    for command in (
        ["runs", "list"],
        ["runs", "show"],
        ["runs", "scale"],
        ["runs", "logs"],
        ["workers", "list"],
        ["runs", "export"],
    ):
        assert "Example" in cli(None, *command, "--help").stdout, command
    assert "docs/" not in cli(None, "runs", "export", "--help").stdout  # no path a pip user lacks


@pytest.mark.timeout(30)
def test_validation_errors_say_what_to_write_and_list_every_field(served_orch: Orchestrator) -> None:
    flags = [
        "--target-batch-size",
        "8",
        "--batch-size",
        "8",
        "--datamodule",
        "worker.examples.digits:DigitsDataModule",
    ]
    file_path = cli(
        served_orch, "runs", "create", "--name", "mlp", "--module", "mypkg/model.py:TinyMLP", *flags
    )
    assert file_path.exit_code == EXIT_ERROR
    assert one_line_error(file_path.stderr) == (
        "error: 422 module: use package.module:ClassName, e.g. worker.examples.digits:DigitsModule "
        "(got 'mypkg/model.py:TinyMLP')"
    )
    bad_name = cli(served_orch, "runs", "create", "--name", "MLP_1", "--module", "a.b:C", *flags)
    assert "name: use 1 to 63 lowercase letters, digits and hyphens" in one_line_error(bad_name.stderr)
    assert "(got 'MLP_1')" in bad_name.stderr and "pattern" not in bad_name.stderr

    missing = cli(
        served_orch, "runs", "create", "--name", "mlp", "--module", "a.b:C", "--datamodule", "a.b:D"
    )
    assert one_line_error(missing.stderr) == "error: 422 missing fields: target_batch_size, batch_size"
    named = ["runs", "create", "--name", "mlp", "--module", "a.b:C", *flags, "--trainer-option"]
    misspelt = cli(served_orch, *named, "gradient_clip_value=1.0")
    assert one_line_error(misspelt.stderr) == (
        "error: 422 trainer: 'gradient_clip_value' is not a trainer option "
        "(did you mean 'gradient_clip_val'?)"
    )
    one_callback = cli(served_orch, *named, "callbacks=shapes.callbacks:GradNorm")
    assert one_line_error(one_callback.stderr) == (
        "error: 422 trainer.callbacks: a list is needed, one class per entry: "
        'callbacks=["shapes.callbacks:GradNorm"]'
    )
    too_many = cli(
        served_orch, "runs", "create", "--name", "mlp", "--module", "a.b:C", *flags, "--workers", "12"
    )
    assert one_line_error(too_many.stderr) == (
        "error: 422 desired_workers (12) must lie in [min_workers=1, max_workers=8]"
    )


@pytest.mark.timeout(30)
def test_the_api_gives_the_same_words(served_orch: Orchestrator) -> None:
    with served_orch.admin() as http:
        answer = http.post(api.runs(), json=run_spec("api-words", module="mypkg.model.TinyMLP"))
    assert answer.status_code == 422
    [error] = answer.json()["detail"]
    assert error["loc"] == ["body", "module"]
    assert error["msg"].startswith("use package.module:ClassName") and "mypkg.model.TinyMLP" in error["msg"]


@pytest.mark.timeout(60)
def test_delete_asks_first_refuses_an_active_run_and_removes_a_finished_one(
    served_orch: Orchestrator,
) -> None:
    created = cli(
        served_orch, "runs", "create", "--json", "--file", "-", stdin=json.dumps(run_spec("doomed"))
    )
    assert created.exit_code == 0, created.output
    active = cli(served_orch, "runs", "delete", "doomed", "--yes")
    assert active.exit_code == EXIT_CONFLICT and "stop it before deleting" in one_line_error(active.stderr)
    assert cli(served_orch, "runs", "stop", "doomed").exit_code == 0

    declined = cli(served_orch, "runs", "delete", "doomed", stdin="n\n")
    assert declined.exit_code == EXIT_ERROR and "Delete run doomed" in declined.stderr
    assert cli(served_orch, "runs", "show", "doomed").exit_code == 0
    confirmed = cli(served_orch, "runs", "delete", "doomed", stdin="y\n")
    assert confirmed.exit_code == 0 and confirmed.stdout == "deleted run doomed\n", confirmed.output
    assert cli(served_orch, "runs", "show", "doomed").exit_code == EXIT_NOT_FOUND

    created = cli(
        served_orch, "runs", "create", "--json", "--file", "-", stdin=json.dumps(run_spec("doomed"))
    )
    assert created.exit_code == 0 and cli(served_orch, "runs", "stop", "doomed").exit_code == 0
    assert (
        cli(served_orch, "--json", "runs", "delete", "doomed", "-y").stdout == '{\n  "deleted": "doomed"\n}\n'
    )


def start_watch(orch: Orchestrator, name: str, stdout: int) -> subprocess.Popen[bytes]:
    """The real ``spotswarm runs watch`` (its own process group), writing to ``stdout``."""
    env = {"PATH": "/usr/bin:/bin", "SPOTSWARM_URL": orch.url, "SPOTSWARM_CONFIG": "/absent.toml"}
    args = [str(VENV_BIN / "spotswarm"), "runs", "watch", name, "--interval", "0.2"]
    return subprocess.Popen(args, stdout=stdout, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def finish_run(orch: Orchestrator, name: str, worker: HandWorker) -> None:
    assert cli(orch, "runs", "stop", name, "--reason", "seen enough").exit_code == 0
    worker.leave(DeregisterReason.stopped)


@pytest.mark.timeout(60)
def test_watch_prints_a_line_per_refresh_without_a_terminal_and_exits_1_when_the_run_stops(
    served_orch: Orchestrator, tmp_path: Path
) -> None:
    created = cli(
        served_orch, "runs", "create", "--json", "--file", "-", stdin=json.dumps(run_spec("watched"))
    )
    worker = HandWorker(served_orch, json.loads(created.stdout)["join_token"], validates=True)
    worker.beat()
    out = tmp_path / "watch.out"
    with out.open("wb") as sink:
        watcher = start_watch(served_orch, "watched", sink.fileno())
    try:
        wait_until(lambda: "workers 1/1" in out.read_text(), 20, message="a refresh shows the worker")
        finish_run(served_orch, "watched", worker)
        assert watcher.wait(timeout=20) == EXIT_ERROR
    finally:
        os.killpg(watcher.pid, signal.SIGKILL) if watcher.poll() is None else None
    lines = out.read_text().splitlines()
    assert re.fullmatch(
        r"\d\d:\d\d:\d\d  state running  workers 1/1  epoch 0  samples/s 50  loss 2.002"
        r"  val_loss 1\.627\d*  val_acc 0\.139\d*  eta -  age \d+s",
        lines[0],
    )
    assert sum("state running" in line for line in lines) == 1, lines  # unchanged refreshes print nothing
    assert lines[-1] == "error: run watched stopped: all workers have left", lines[-1]
    assert "\x1b" not in out.read_text()  # no screen control codes in a pipe


@pytest.mark.timeout(60)
def test_watch_redraws_a_table_of_the_run_and_its_workers_on_a_terminal(served_orch: Orchestrator) -> None:
    created = cli(
        served_orch, "runs", "create", "--json", "--file", "-", stdin=json.dumps(run_spec("watched-tty"))
    )
    worker = HandWorker(served_orch, json.loads(created.stdout)["join_token"], hostname="tty-box")
    leader, follower = pty.openpty()
    watcher = start_watch(served_orch, "watched-tty", follower)
    os.close(follower)
    screen = bytearray()

    def seen(text: bytes) -> bool:
        while select.select([leader], [], [], 0.1)[0]:
            try:
                screen.extend(os.read(leader, 65536))
            except OSError:  # the watcher has exited and closed the terminal
                break
        return text in screen

    try:
        worker.beat()
        wait_until(lambda: seen(b"tty-box"), 20, message="the workers table shows the worker's host")
        finish_run(served_orch, "watched-tty", worker)
        assert watcher.wait(timeout=20) == EXIT_ERROR
        seen(b"")
    finally:
        os.killpg(watcher.pid, signal.SIGKILL) if watcher.poll() is None else None
        os.close(leader)
    text = screen.decode(errors="replace")
    assert "\x1b[2J" in text and "spotswarm runs watch watched-tty" in text  # cleared and redrawn
    assert re.search(r"NAME +STATE +WORKERS", text) and re.search(r"ID +STATE +HANDLE +HOST", text)
    assert "error: run watched-tty stopped: all workers have left" in text
