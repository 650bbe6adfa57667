"""Run specs the tests create: a valid one with tiny classes (never trained), changed by keyword."""

from __future__ import annotations

from typing import Any


def run_spec(name: str, **overrides: Any) -> dict[str, Any]:
    """A valid run spec (tiny classes from tests/support/models.py) with ``overrides``."""
    spec: dict[str, Any] = {
        "name": name,
        "module": "tests.support.models:TinyModule",
        "datamodule": "tests.support.models:TinyDataModule",
        "target_batch_size": 64,
        "batch_size": 8,
        "min_workers": 0,
        "max_workers": 4,
        "desired_workers": 1,
    }
    spec.update(overrides)
    return spec
