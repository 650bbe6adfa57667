"""Every ``spotswarm`` client command the docs show (and their curl tour of the API) runs as written
against one real orchestrator: placeholders filled in the one documented way
(``tests/support/docs_commands.py``), each run it names created first, and each run a ``runs create``
makes removed first."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.cli import cli
from tests.support.docs_commands import (
    PROJECT_DIRS,
    RUN_ELSEWHERE,
    RUN_IN_SHELL,
    DocCommand,
    doc_files,
    documented_commands,
    substitute,
)
from tests.support.orchestrator import HAND_ONLY, Orchestrator
from tests.support.processes import VENV_BIN
from tests.support.specs import run_spec

RUN_NAME = "docs-run"
# Module paths are imported at create time, as users get it: a wrong class name in the docs fails here.
IMPORTS_CHECKED = {"SPOTSWARM_CHECK_IMPORTS": "true"}
# The ec2 launcher offered (the AWS section creates a run on it) but never called: the reconcile loop is off.
EC2_OFFERED = {
    "SPOTSWARM_EC2_LAUNCH_TEMPLATE": "spotswarm-worker",
    "SPOTSWARM_EC2_REGION": "us-east-1",
    "SPOTSWARM_EC2_ENDPOINT_URL": "http://127.0.0.1:9",
    "SPOTSWARM_EC2_WORKER_IMAGE": "registry.example/spotswarm-worker:0.1.0",
}
EXPECTED_RUN = 37  # documented commands this test runs: a command left out by mistake changes the count
NAMED_BY_POSITION = {
    ("runs", s) for s in ("show", "scale", "stop", "resume", "rotate-join-token", "logs")
} | {
    ("workers", "list"),
    ("checkpoints", "list"),
    ("peers", None),
}


ORCHESTRATOR_ENV = {**HAND_ONLY, **EC2_OFFERED, **IMPORTS_CHECKED}


def _yaml_files(cwd: Path) -> None:
    """Write the spec files the docs show (a ```yaml block starting ``# run.yaml``) into ``cwd``."""
    for path in doc_files():
        for block in re.findall(r"```yaml\n(.*?)```", path.read_text(), re.S):
            first = block.splitlines()[0]
            if first.startswith("# ") and first.endswith(".yaml"):
                (cwd / first[2:]).write_text(block)


def _ensure_present(orch: Orchestrator, name: str) -> None:
    """A run ``name``, created unless it exists (no workers: the reconcile loop is off)."""
    with orch.admin() as http:
        if http.get(f"/api/v1/runs/{name}").status_code == 200:
            return
        created = http.post("/api/v1/runs", json=run_spec(name))
        assert created.status_code == 201, created.text


def _ensure_absent(orch: Orchestrator, name: str) -> None:
    with orch.admin() as http:
        if http.get(f"/api/v1/runs/{name}").status_code == 404:
            return
        http.post(f"/api/v1/runs/{name}/stop")
        deleted = http.delete(f"/api/v1/runs/{name}")
        assert deleted.status_code == 204, deleted.text


def _prepare(orch: Orchestrator, argv: list[str], cwd: Path) -> None:
    """Create the run a command names, or remove the one it is about to create."""
    if argv[:2] == ["runs", "create"]:
        if "--name" in argv:
            _ensure_absent(orch, argv[argv.index("--name") + 1])
        for flag in ("-f", "--file"):
            if flag in argv:
                _ensure_absent(orch, yaml.safe_load((cwd / argv[argv.index(flag) + 1]).read_text())["name"])
        return
    key = (argv[0], argv[1] if argv[0] != "peers" else None)
    position = 1 if argv[0] == "peers" else 2
    if key in NAMED_BY_POSITION and len(argv) > position and not argv[position].startswith("-"):
        _ensure_present(orch, argv[position])
    if argv[:2] == ["runs", "delete"]:  # only a finished run can go
        _ensure_present(orch, argv[2])
        with orch.admin() as http:
            http.post(f"/api/v1/runs/{argv[2]}/stop")


def _run_cli(orch: Orchestrator, command: DocCommand) -> None:
    values = {"NAME": RUN_NAME, "N": "3", "TEXT": "stopped-by-the-docs-test", "ssa_...": orch.admin_token}
    argv = substitute(shlex.split(command.text, comments=True)[1:], values)
    _prepare(orch, argv, Path.cwd())
    done = cli(orch, *argv, env={"WANDB_API_KEY": "from-my-shell"})
    assert done.exit_code == 0, f"{command.file}:{command.line}: spotswarm {shlex.join(argv)}\n{done.output}"


def _run_shell(orch: Orchestrator, command: DocCommand, cwd: Path, join_token: str) -> None:
    for name in re.findall(r"spotswarm runs show ([a-z0-9-]+)", command.text):
        _ensure_present(orch, name)
    for name in re.findall(r'(?:"name": "|--name )([a-z0-9-]+)', command.text):
        _ensure_absent(orch, name)
    (cwd / ".curlrc").write_text("--fail-with-body\n")  # an HTTP error fails the line
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SPOTSWARM_")},
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
        "CURL_HOME": str(cwd),
        "URL": orch.url,
        "TOKEN": orch.admin_token,
        "JOIN_TOKEN": join_token,
        "H": f"Authorization: Bearer {orch.admin_token}",
        "SPOTSWARM_URL": orch.url,
        "SPOTSWARM_TOKEN": orch.admin_token,
        "SPOTSWARM_CONFIG": str(cwd / "absent.toml"),
    }
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-ec", command.text],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, f"{command.file}:{command.line}: {command.text}\n{done.stdout}{done.stderr}"


def _enter_project(command: DocCommand, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A documented ``cd DIR``: make DIR under ``root`` with its files (PROJECT_DIRS) and go there."""
    project = root / command.code.split()[1]
    for relative, text in PROJECT_DIRS[command.text].items():
        (project / relative).parent.mkdir(parents=True, exist_ok=True)
        (project / relative).write_text(text)
    monkeypatch.chdir(project)


@pytest.mark.timeout(120)
def test_every_documented_cli_and_curl_command_runs_as_written(
    served_orch: Orchestrator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _yaml_files(tmp_path)
    _ensure_present(served_orch, "joinable")
    with served_orch.admin() as http:
        join_token = http.post("/api/v1/runs/joinable/join-token").json()["join_token"]
    ran, file = 0, ""
    for command in documented_commands():
        if command.file != file:  # each page starts in the directory with the spec files
            file = command.file
            monkeypatch.chdir(tmp_path)
        if command.text in PROJECT_DIRS:
            _enter_project(command, tmp_path, monkeypatch)
        elif command.is_plain_cli and command.text not in RUN_ELSEWHERE:
            _run_cli(served_orch, command)
        elif command.text in RUN_IN_SHELL:
            _run_shell(served_orch, command, Path.cwd(), join_token)
        else:
            continue
        ran += 1
    assert ran == EXPECTED_RUN, f"ran {ran} documented commands"
