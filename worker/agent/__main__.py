"""``python -m worker.agent``: the same as ``spotswarm-worker`` (the local launcher starts workers so)."""

import sys

from worker.agent import main

sys.exit(main())
