"""Compose README.md from its parts: ``python docs/readme/compose.py`` (``--check`` fails if it differs).

README.md is what users read on the project page, so it is committed whole; its sections are edited
here, one file per section, in the order below, between ``_head.md`` (title, quick start, overview)
and ``_tail.md`` (development).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
README = HERE.parent.parent / "README.md"
SECTIONS = (
    "strategy",
    "runs",
    "your-code",
    "training",
    "worker",
    "orchestrator",
    "status-page-and-cli",
    "operability",
    "aws",
    "security",
    "reliability",
)


def compose() -> str:
    """The README's text: head, each section followed by one blank line, tail."""
    body = "".join((HERE / f"{name}.md").read_text().rstrip() + "\n\n" for name in SECTIONS)
    return (HERE / "_head.md").read_text() + body + (HERE / "_tail.md").read_text()


def main(argv: list[str]) -> int:
    text = compose()
    if "--check" in argv:
        if README.read_text() != text:
            print("README.md is out of date: run python docs/readme/compose.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
