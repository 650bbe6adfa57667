"""The worker agent's exit codes, which launchers read to tell a worker worth replacing from a run that
cannot work on any worker (codes 128+N mean "killed by signal N").
"""

from __future__ import annotations

EXIT_OK = 0  # stopped, completed, interrupted: left the run cleanly
EXIT_FAILED = 1  # training crashed or the orchestrator stayed unreachable: worth another worker
EXIT_USAGE = 2  # bad command line or environment (argparse's own code)
EXIT_CONFIG = 3  # permanent: bad join token, user module does not import, unusable run spec
EXIT_ORCHESTRATOR_LOST = 4  # no answer from the orchestrator for --orchestrator-lost-timeout-s: left
#: what a shell exits with when the worker's command is not executable, or not found
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127
#: Exits after which another worker would fail alike: a launcher does not retry them.
PERMANENT_EXIT_CODES = frozenset({EXIT_USAGE, EXIT_CONFIG, EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND})
