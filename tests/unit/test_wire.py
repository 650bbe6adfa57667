"""The wire format rejects what the API must reject."""

import pytest
from pydantic import ValidationError

from worker.wire import Heartbeat, RunSpec

BASE = {
    "name": "digits",
    "module": "worker.examples.digits:DigitsModule",
    "datamodule": "worker.examples.digits:DigitsDataModule",
    "target_batch_size": 256,
    "batch_size": 32,
}


def test_run_spec_defaults_are_consistent() -> None:
    spec = RunSpec(**BASE)
    assert spec.min_workers <= spec.desired_workers <= spec.max_workers


@pytest.mark.parametrize(
    "override",
    [
        {"min_workers": 3, "max_workers": 2},
        {"desired_workers": 9, "max_workers": 8},
        {"batch_size": 0},
        {"name": "Bad Name"},
        {"module": "no_colon_here"},
        {"unknown_field": 1},
    ],
)
def test_run_spec_rejects_bad_input(override: dict) -> None:
    with pytest.raises(ValidationError):
        RunSpec(**{**BASE, **override})


def test_heartbeat_rejects_nan_loss() -> None:
    with pytest.raises(ValidationError):
        Heartbeat(loss=float("nan"))
