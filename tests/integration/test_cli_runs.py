"""`spotswarm runs ...` against a real orchestrator: create, list, show (with its chart), scale, stop,
resume and logs (also --follow, as a real subprocess that must exit when the run ends)."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.support import api
from tests.support.cli import HandWorker, cli
from tests.support.orchestrator import Orchestrator
from tests.support.processes import REPO_ROOT, VENV_BIN
from tests.support.specs import run_spec
from tests.support.waiting import wait_until
from tests.support.workers import heartbeat, register
from worker.protocol.workers import DeregisterReason


def api_run(orch: Orchestrator, name: str) -> dict:
    with orch.admin() as http:  # the full view, with the spec's args
        return dict(http.get(api.run(name)).json())


def progress_points(orch: Orchestrator, name: str) -> list[dict]:
    with orch.client() as http:
        return list(http.get(api.run_progress(name)).json()["points"])


def create(orch: Orchestrator, name: str, **overrides: object) -> str:
    """Create a run through the CLI (--json) and return its join token."""
    spec = json.dumps(run_spec(name, **overrides))
    result = cli(orch, "runs", "create", "--json", "--file", "-", stdin=spec)
    assert result.exit_code == 0, result.output
    return str(json.loads(result.stdout)["join_token"])


@pytest.mark.timeout(60)
def test_create_from_yaml_file_with_flag_overrides(served_orch: Orchestrator, tmp_path: Path) -> None:
    spec = tmp_path / "run.yaml"
    spec.write_text(
        "name: from-yaml\n"
        "module: tests.support.models:TinyModule\n"
        "datamodule: tests.support.models:TinyDataModule\n"
        "target_batch_size: 64\nbatch_size: 8\nmin_workers: 0\nmax_workers: 4\ndesired_workers: 1\n"
        "module_args: {hidden: 3}\n"
    )
    result = cli(
        served_orch,
        "runs",
        "create",
        "--file",
        str(spec),
        "--workers",
        "2",
        "--target-epochs",
        "7",
        "--module-arg",
        "hidden=5",
        "--datamodule-arg",
        "size=16",
    )
    assert result.exit_code == 0, result.output
    assert "created run from-yaml" in result.stdout and "ssj_" in result.stdout
    run = api_run(served_orch, "from-yaml")
    assert run["workers"]["desired"] == 2
    assert run["spec"]["stop"]["target_epochs"] == 7
    assert run["spec"]["module_args"] == {"hidden": 5} and run["spec"]["datamodule_args"] == {"size": 16}


# The round trip of the docs (status-page-and-cli.md), as a shell runs it: jq and the CLI.
ROUND_TRIP = (
    "spotswarm runs show from-spec --json | jq .run.spec > spec.json && "
    "spotswarm runs create -f spec.json --name from-spec-2"
)


@pytest.mark.timeout(60)
def test_a_shown_spec_creates_the_same_run_again(served_orch: Orchestrator, tmp_path: Path) -> None:
    args = {"module_args": {"hidden": 6}, "datamodule_args": {"size": 12}}
    create(served_orch, "from-spec", stop={"target_epochs": 9}, **args)
    env = {"PATH": f"{VENV_BIN}:/usr/bin:/bin", "SPOTSWARM_URL": served_orch.url}
    env.update(SPOTSWARM_TOKEN=served_orch.admin_token, SPOTSWARM_CONFIG=str(tmp_path / "absent.toml"))
    done = subprocess.run(
        ["bash", "-c", ROUND_TRIP], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=50
    )
    assert done.returncode == 0, done.stderr
    documented = (REPO_ROOT / "docs/operations/status-page-and-cli.md").read_text()
    assert ROUND_TRIP in documented  # the documented line
    original, copy = api_run(served_orch, "from-spec")["spec"], api_run(served_orch, "from-spec-2")["spec"]
    assert copy == {**original, "name": "from-spec-2"} and copy["module_args"] == {"hidden": 6}


def shown_value(text: str, key: str) -> str:
    """The value on the ``runs show`` line of ``key``."""
    return next(line.split()[1] for line in text.splitlines() if line.split()[:1] == [key])


@pytest.mark.timeout(60)
def test_list_show_scale_stop_resume(served_orch: Orchestrator) -> None:
    join = create(
        served_orch, "steer", stop={"target_samples": 100_000}, strategy_options={"sync": "gradients"}
    )
    worker = HandWorker(served_orch, join, validates=True)

    def beat_until_charted() -> bool:  # a heartbeat per poll until a few progress samples are stored
        worker.beat()
        return len(progress_points(served_orch, "steer")) >= 3

    wait_until(beat_until_charted, 15, interval_s=0.2, message="progress samples stored")

    listed = cli(served_orch, "runs", "list")
    assert listed.exit_code == 0, listed.output
    header, *rows = listed.stdout.splitlines()
    assert header.split()[:4] == ["NAME", "STATE", "WORKERS", "EPOCH"]
    row = next(r.split() for r in rows if r.startswith("steer "))
    assert row[1] == "running" and row[2] == "1/1"

    shown = cli(served_orch, "runs", "show", "steer")
    assert shown.exit_code == 0, shown.output
    assert "1 live / 1 desired" in shown.stdout and "samples 100000" in shown.stdout
    chart = [line for line in shown.stdout.splitlines() if "|" in line]
    assert len(chart) == 12 and any(ch in "".join(chart) for ch in "#▁▂▃▄▅▆▇█")  # loss and val_loss
    assert "\nval_loss (" in shown.stdout and shown_value(shown.stdout, "val_acc") != "-"

    scaled = cli(served_orch, "runs", "scale", "steer", "3")
    assert scaled.exit_code == 0 and "3 desired" in scaled.stdout
    assert api_run(served_orch, "steer")["workers"]["desired"] == 3

    worker.beat()  # live as the stop comes: the run waits for it to leave
    stopped = cli(served_orch, "runs", "stop", "steer", "--reason", "enough", "--json")
    assert stopped.exit_code == 0 and json.loads(stopped.stdout)["state"] == "stopping"
    assert worker.beat().action.value == "stop"
    worker.leave(DeregisterReason.stopped)
    wait_until(lambda: api_run(served_orch, "steer")["state"] == "stopped", 15, message="run stopped")
    final = cli(served_orch, "runs", "show", "steer").stdout  # a finished run keeps its last loss and metrics
    assert shown_value(final, "loss") != "-" and shown_value(final, "val_loss") != "-", final

    resumed = cli(served_orch, "runs", "resume", "steer")
    assert resumed.exit_code == 0 and "pending" in resumed.stdout


@pytest.mark.timeout(60)
def test_logs_prints_history_and_follow_exits_when_the_run_ends(served_orch: Orchestrator) -> None:
    create(served_orch, "logged")
    history = cli(served_orch, "runs", "logs", "logged")
    assert history.exit_code == 0 and "run.created" in history.stdout

    follow = subprocess.Popen(
        [
            str(VENV_BIN / "spotswarm"),
            "runs",
            "logs",
            "logged",
            "--follow",
            "--interval",
            "0.2",
            "--json",
            "--url",
            served_orch.url,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={"PATH": "/usr/bin:/bin", "SPOTSWARM_CONFIG": "/nonexistent.toml"},
    )
    try:
        with httpx.Client(
            base_url=served_orch.url, headers={"Authorization": f"Bearer {served_orch.admin_token}"}
        ) as http:
            assert http.post(api.run_stop("logged"), json={"reason": "end of test"}).status_code == 200
        out, err = follow.communicate(timeout=20)
    finally:
        follow.kill()
    assert follow.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert events[0]["kind"] == "run.created"
    assert "stopped" in events[-1]["message"], events  # the final event was printed before exiting


@pytest.mark.timeout(60)
def test_the_compose_sections_create_command_works_as_documented(served_orch: Orchestrator) -> None:
    """The docker compose guide: its ``spotswarm runs create`` line, copied as it is."""
    section = (REPO_ROOT / "docs" / "guides" / "docker-compose.md").read_text()
    block = section.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    [command] = [line for line in block.splitlines() if line.startswith("spotswarm runs create")]
    args = shlex.split(command, comments=True)

    done = cli(served_orch, *args[1:])

    assert done.exit_code == 0, done.output
    assert "ssj_" in done.output and "SPOTSWARM_JOIN_TOKEN=ssj_..." in block
    run = api_run(served_orch, "digits-compose")
    assert run["workers"]["desired"] == 0
    # its workers all join by hand: one of them must be allowed to checkpoint the run
    assert run["spec"]["hand_joined_checkpoint"] is True


def _post_register(orch: Orchestrator, token: str) -> httpx.Response:
    with orch.client(token) as http:
        return http.post(api.register(), json={"hostname": "box"})


@pytest.mark.timeout(120)
def test_rotating_the_join_token_voids_the_old_one_and_keeps_live_workers(served_orch: Orchestrator) -> None:
    name, old_join = "rotated", create(served_orch, "rotated")
    worker = register(served_orch, old_join)
    result = cli(served_orch, "runs", "rotate-join-token", name)
    assert result.exit_code == 0, result.output
    new_join = result.output.strip().splitlines()[-1].split()[-1]
    assert new_join.startswith("ssj_") and new_join != old_join
    assert _post_register(served_orch, old_join).status_code == 401
    with served_orch.client(old_join) as http:
        assert http.get(api.run_latest_checkpoint(name)).status_code == 401
    assert heartbeat(served_orch, worker)["action"] == "continue"  # live workers keep their worker tokens
    register(served_orch, new_join)
    with served_orch.client(worker["worker_token"]) as http:  # only the admin rotates
        assert http.post(api.run_join_token(name)).status_code == 403
    with served_orch.admin() as http:
        rotated = http.post(api.run_join_token(name))
    assert rotated.status_code == 200 and rotated.json()["join_token"] not in (old_join, new_join)


@pytest.mark.timeout(60)
def test_runs_create_flags_say_what_hand_joined_workers_are_trusted_with(served_orch: Orchestrator) -> None:
    spec = json.dumps(run_spec("trusty", secret_env={"API_KEY": "sk-trusty-123456"}))  # opts in to checkpoint
    args = ("--no-hand-joined-checkpoint", "--no-hand-joined-secrets")
    created = cli(served_orch, "runs", "create", "--json", "--file", "-", *args, stdin=spec)
    assert created.exit_code == 0, created.output
    shown = api_run(served_orch, "trusty")["spec"]  # the flags win over the file
    assert shown["hand_joined_checkpoint"] is False and shown["hand_joined_secrets"] is False
    assert _post_register(served_orch, json.loads(created.stdout)["join_token"]).json()["secret_env"] == {}
