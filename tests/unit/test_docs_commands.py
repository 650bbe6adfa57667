"""Every command the docs show is accounted for: run by the docs-command test, run by a named test,
or listed with the reason it cannot run here (``tests/support/docs_commands.py``)."""

from __future__ import annotations

import re
import shlex

from tests.support.docs_commands import (
    NOT_RUN_HERE,
    PROJECT_DIRS,
    RUN_ELSEWHERE,
    RUN_IN_SHELL,
    documented_commands,
    substitute,
)
from tests.support.processes import REPO_ROOT


def test_every_documented_command_is_run_or_listed_with_a_reason() -> None:
    listed = RUN_IN_SHELL | set(RUN_ELSEWHERE) | set(NOT_RUN_HERE) | set(PROJECT_DIRS)
    unlisted = [
        f"{c.file}:{c.line}: {c.text}"
        for c in documented_commands()
        if not c.is_plain_cli and c.text not in listed
    ]
    assert not unlisted, (
        "commands no test runs (run them or list them in tests/support/docs_commands.py):\n"
        + "\n".join(unlisted)
    )


def test_every_listed_command_is_still_documented() -> None:
    shown = {c.text for c in documented_commands()}
    stale = sorted((RUN_IN_SHELL | set(RUN_ELSEWHERE) | set(NOT_RUN_HERE) | set(PROJECT_DIRS)) - shown)
    assert not stale, "listed in tests/support/docs_commands.py but no longer in the docs:\n" + "\n".join(
        stale
    )


def test_the_tests_named_for_documented_commands_exist() -> None:
    for command, node in RUN_ELSEWHERE.items():
        path, _, name = node.partition("::")
        source = (REPO_ROOT / path).read_text()
        assert re.search(rf"^def {re.escape(name)}\(", source, re.M), f"{node} (for {command!r}) not found"


def test_placeholders_are_filled_in_one_way() -> None:
    argv = shlex.split("runs resume NAME [--target-epochs N | --target-samples N] --reason [x]")
    filled = substitute(argv, {"NAME": "r1", "N": "3"})
    assert filled == ["runs", "resume", "r1", "--target-epochs", "3", "--reason", "x"]
    assert substitute(["--opt", "a=[1]", "[--json]", "..."], {}) == ["--opt", "a=[1]", "--json"]
