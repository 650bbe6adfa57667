"""worker/_hivemind_compat.py: a peer forked from a hivemind importer, with locks of its own, starts
its DHT even after a sibling was killed holding hivemind's send lock.

Each case runs in an interpreter of its own (``tests/programs/forked_peer_locks.py``): the poisoned lock
is shared by the whole family of the process that imported hivemind, this test process included if it
were the parent.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.processes import REPO_ROOT

PROGRAM = [sys.executable, "-m", "tests.programs.forked_peer_locks"]


def run(*args: str) -> tuple[int, str]:
    done = subprocess.run([*PROGRAM, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=90)
    return done.returncode, done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[
        -2000:
    ]


@pytest.mark.timeout(120)
def test_with_locks_of_its_own_a_peer_starts_after_a_sibling_was_killed_holding_one() -> None:
    assert run("--own-locks") == (0, "ready")


@pytest.mark.timeout(120)
def test_without_them_the_killed_sibling_blocks_it() -> None:
    """The failure the fix prevents (the reason it exists), in hivemind as shipped."""
    assert run() == (1, "blocked")
