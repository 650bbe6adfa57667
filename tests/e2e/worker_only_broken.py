"""A module that imports in the orchestrator's check but not inside a worker (as a missing dependency on
the worker image would): importing it with ``SPOTSWARM_REQUEST_ID`` set raises ImportError."""

import os

if os.environ.get("SPOTSWARM_REQUEST_ID"):
    raise ImportError("No module named 'a_dependency_missing_on_workers'")

from worker.examples.digits import DigitsDataModule, DigitsModule

__all__ = ["DigitsDataModule", "DigitsModule"]
