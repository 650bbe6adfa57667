"""README.md is composed from docs/readme/ (docs/readme/compose.py): the committed file must match."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO_ROOT


def test_readme_matches_its_parts() -> None:
    done = subprocess.run(
        [sys.executable, "docs/readme/compose.py", "--check"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
