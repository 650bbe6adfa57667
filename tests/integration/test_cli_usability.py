"""The CLI as people use it: connection options before or after the subcommand, ``--version``, defaults
and examples in ``--help``, and validation errors in words, every one of them listed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib.metadata import version

import pytest

from orchestrator.cli.client import EXIT_ERROR, EXIT_UNREACHABLE
from tests.helpers import free_port
from tests.integration.cli_support import HAND_ONLY, cli
from tests.orchestrator_fixture import Orchestrator, orchestrator_in, run_spec


@pytest.fixture(scope="module")
def orch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Orchestrator]:
    with orchestrator_in(tmp_path_factory.mktemp("cli-usability"), extra_env=HAND_ONLY) as orch:
        yield orch


def one_line_error(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


@pytest.mark.timeout(30)
def test_connection_options_work_before_and_after_the_subcommand(orch: Orchestrator) -> None:
    created = cli(orch, "runs", "create", "--json", "--file", "-", stdin=json.dumps(run_spec("global-opts")))
    assert created.exit_code == 0, created.output
    before = cli(None, "--url", orch.url, "--token", orch.admin_token, "--json", "runs", "list")
    assert before.exit_code == 0, before.output
    assert [run["name"] for run in json.loads(before.stdout)["items"]] == ["global-opts"]
    after = cli(None, "runs", "list", "--url", orch.url, "--json")
    assert after.exit_code == 0 and json.loads(after.stdout)["items"][0]["name"] == "global-opts"
    dead = f"http://127.0.0.1:{free_port()}"
    command_wins = cli(None, "--url", dead, "runs", "show", "global-opts", "--url", orch.url)
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
    ):
        assert "Example" in cli(None, *command, "--help").stdout, command


@pytest.mark.timeout(30)
def test_validation_errors_say_what_to_write_and_list_every_field(orch: Orchestrator) -> None:
    flags = [
        "--target-batch-size",
        "8",
        "--batch-size",
        "8",
        "--datamodule",
        "worker.examples.digits:DigitsDataModule",
    ]
    file_path = cli(orch, "runs", "create", "--name", "mlp", "--module", "mypkg/model.py:TinyMLP", *flags)
    assert file_path.exit_code == EXIT_ERROR
    assert one_line_error(file_path.stderr) == (
        "error: 422 module: use package.module:ClassName, e.g. worker.examples.digits:DigitsModule "
        "(got 'mypkg/model.py:TinyMLP')"
    )
    bad_name = cli(orch, "runs", "create", "--name", "MLP_1", "--module", "a.b:C", *flags)
    assert "name: use 1 to 63 lowercase letters, digits and hyphens" in one_line_error(bad_name.stderr)
    assert "(got 'MLP_1')" in bad_name.stderr and "pattern" not in bad_name.stderr

    missing = cli(orch, "runs", "create", "--name", "mlp", "--module", "a.b:C", "--datamodule", "a.b:D")
    assert one_line_error(missing.stderr) == "error: 422 missing fields: target_batch_size, batch_size"
    too_many = cli(orch, "runs", "create", "--name", "mlp", "--module", "a.b:C", *flags, "--workers", "12")
    assert one_line_error(too_many.stderr) == (
        "error: 422 desired_workers (12) must lie in [min_workers=1, max_workers=8]"
    )


@pytest.mark.timeout(30)
def test_the_api_gives_the_same_words(orch: Orchestrator) -> None:
    with orch.admin() as http:
        answer = http.post("/api/v1/runs", json=run_spec("api-words", module="mypkg.model.TinyMLP"))
    assert answer.status_code == 422
    [error] = answer.json()["detail"]
    assert error["loc"] == ["body", "module"]
    assert error["msg"].startswith("use package.module:ClassName") and "mypkg.model.TinyMLP" in error["msg"]
