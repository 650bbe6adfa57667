"""Run specs the tests create: a valid one with tiny classes (never trained), changed by keyword."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from tests.support import api

if TYPE_CHECKING:
    from tests.support.orchestrator import ApiServer

_names = itertools.count()


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
        # the tests' workers join by hand in place of launched ones, and most of them checkpoint the run
        # (tests/api/test_hand_joined_trust.py tests the default, false)
        "hand_joined_checkpoint": True,
    }
    spec.update(overrides)
    return spec


def create_run(orch: ApiServer, prefix: str = "run", **overrides: Any) -> tuple[str, str]:
    """Create a run named ``<prefix>-<n>`` (unique in this test process) through the API, as the admin;
    its name and join token."""
    name = f"{prefix}-{next(_names)}"
    with orch.admin() as http:
        response = http.post(api.runs(), json=run_spec(name, **overrides))
    assert response.status_code == 201, response.text
    return name, response.json()["join_token"]


def post_run(orch: ApiServer, spec: dict[str, Any]) -> dict[str, Any]:
    """Create the run ``spec`` describes, as the admin; the API's reply (with its join token)."""
    with orch.admin() as http:
        return dict(http.post(api.runs(), json=spec, timeout=120).raise_for_status().json())
