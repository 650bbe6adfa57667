"""Every CLI failure is one line on stderr and a documented exit code, never a traceback: an unreachable
server, a bad or missing token, an unknown run, a spec the server rejects, a conflicting action.
Also: where the URL and token come from (flags over env over the config file)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from orchestrator.cli.client import EXIT_AUTH, EXIT_CONFLICT, EXIT_ERROR, EXIT_NOT_FOUND, EXIT_UNREACHABLE
from tests.support.cli import cli
from tests.support.orchestrator import Orchestrator
from tests.support.ports import free_port
from tests.support.processes import VENV_BIN
from tests.support.specs import run_spec


def spotswarm(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real console script, as a user runs it."""
    base = {"PATH": "/usr/bin:/bin", "SPOTSWARM_CONFIG": "/nonexistent/config.toml"}
    return subprocess.run(
        [str(VENV_BIN / "spotswarm"), *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**base, **(env or {})},
    )


def assert_one_line_error(stderr: str, *fragments: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.timeout(30)
def test_unreachable_server_is_one_line_and_exit_3() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = spotswarm("runs", "list", "--url", url)
    assert done.returncode == EXIT_UNREACHABLE
    assert_one_line_error(done.stderr, "unreachable", url)
    assert done.stdout == ""


@pytest.mark.timeout(30)
def test_bad_token_is_exit_4_with_the_servers_detail(served_orch: Orchestrator) -> None:
    done = spotswarm(
        "runs", "scale", "any", "2", "--url", served_orch.url, env={"SPOTSWARM_TOKEN": "ssa_wrong"}
    )
    assert done.returncode == EXIT_AUTH
    assert_one_line_error(done.stderr, "401", "invalid token")
    missing = cli(served_orch, "runs", "stop", "anything", token="")
    assert missing.exit_code == EXIT_AUTH
    assert_one_line_error(missing.stderr, "401", "--token")


@pytest.mark.timeout(30)
def test_unknown_run_is_exit_5(served_orch: Orchestrator) -> None:
    for args in (
        ["runs", "show", "no-such-run"],
        ["workers", "list", "no-such-run"],
        ["checkpoints", "download", "no-such-run"],
        ["runs", "export", "no-such-run"],
        ["runs", "logs", "no-such-run"],
    ):
        result = cli(served_orch, *args)
        assert result.exit_code == EXIT_NOT_FOUND, (args, result.output)
        assert_one_line_error(result.stderr, "404", "no-such-run")


@pytest.mark.timeout(30)
def test_rejected_spec_and_conflicting_actions_are_one_line(
    served_orch: Orchestrator, tmp_path: Path
) -> None:
    bad = cli(
        served_orch,
        "runs",
        "create",
        "--name",
        "Bad Name",
        "--module",
        "x:Y",
        "--datamodule",
        "x:Z",
        "--target-batch-size",
        "8",
        "--batch-size",
        "8",
    )
    assert bad.exit_code == EXIT_ERROR
    assert_one_line_error(bad.stderr, "422", "name")

    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    unreadable = cli(served_orch, "runs", "create", "--file", str(broken))
    assert unreadable.exit_code == EXIT_ERROR
    assert_one_line_error(unreadable.stderr, "not valid YAML")

    assert (
        cli(served_orch, "runs", "create", "--file", "-", stdin=json.dumps(run_spec("conflicted"))).exit_code
        == 0
    )
    nothing = cli(served_orch, "runs", "export", "conflicted")
    assert nothing.exit_code == EXIT_NOT_FOUND
    assert_one_line_error(nothing.stderr, "conflicted has no checkpoints yet")
    again = cli(served_orch, "runs", "resume", "conflicted")  # pending: nothing to resume
    assert again.exit_code == EXIT_CONFLICT
    assert_one_line_error(again.stderr, "409")
    over = cli(served_orch, "runs", "scale", "conflicted", "99")  # above max_workers
    assert over.exit_code == EXIT_ERROR
    assert_one_line_error(over.stderr, "422", "desired_workers (99)")


@pytest.mark.timeout(30)
def test_url_and_token_come_from_flags_env_or_config_file(served_orch: Orchestrator, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'# spotswarm CLI\nurl = "{served_orch.url}"\ntoken = "{served_orch.admin_token}"\n')
    from_file = spotswarm("runs", "scale", "not-there", "2", env={"SPOTSWARM_CONFIG": str(config)})
    assert from_file.returncode == EXIT_NOT_FOUND, from_file.stderr  # URL and token both came from the file
    dead = f"http://127.0.0.1:{free_port()}"
    env_wins = spotswarm("runs", "list", env={"SPOTSWARM_CONFIG": str(config), "SPOTSWARM_URL": dead})
    assert env_wins.returncode == EXIT_UNREACHABLE
    # a run of its own to list (the module's other tests may run in another process: not theirs)
    assert (
        cli(served_orch, "runs", "create", "--file", "-", stdin=json.dumps(run_spec("listed"))).exit_code == 0
    )
    flag_wins = spotswarm("runs", "list", "--url", served_orch.url, env={"SPOTSWARM_URL": dead})
    assert flag_wins.returncode == 0 and flag_wins.stdout.startswith("NAME"), flag_wins.stdout
    assert "listed" in flag_wins.stdout
    config.write_text("url = [broken\n")
    broken = spotswarm("runs", "list", env={"SPOTSWARM_CONFIG": str(config)})
    assert broken.returncode == EXIT_ERROR
    assert_one_line_error(broken.stderr, "config file")


@pytest.mark.timeout(30)
def test_a_missing_or_unreadable_ca_certificate_is_one_line_and_exit_2(tmp_path: Path) -> None:
    url = f"https://127.0.0.1:{free_port()}"
    missing = spotswarm("runs", "list", "--url", url, "--ca-cert", str(tmp_path / "nope.pem"))
    assert missing.returncode == 2
    assert_one_line_error(missing.stderr, "CA certificate file", "does not exist")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    broken = spotswarm("runs", "list", "--url", url, env={"SPOTSWARM_CA_CERT": str(garbage)})
    assert broken.returncode == 2
    assert_one_line_error(broken.stderr, f"cannot use {garbage} as CA certificate")
