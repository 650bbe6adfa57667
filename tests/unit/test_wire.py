"""The wire format rejects what the API must reject."""

import re

import pytest
from pydantic import ValidationError

from worker.protocol.metrics import DEFAULT_REPORT_METRICS, select_metrics
from worker.protocol.runs import RunSpec
from worker.protocol.trainer import trainer_option_in_strategy_options
from worker.protocol.workers import Heartbeat

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


# -- the trainer section and reported metrics -------------------------------------------------------


def test_a_trainer_section_passes_only_what_differs_from_lightnings_defaults() -> None:
    options = {
        "precision": "bf16-mixed",
        "gradient_clip_val": 1.0,
        "val_check_interval": 50,
        "check_val_every_n_epoch": None,
        "limit_val_batches": 0.25,
        "deterministic": "warn",
    }
    callbacks = ["lightning.pytorch.callbacks:LearningRateMonitor"]
    spec = RunSpec(**BASE, trainer={**options, "callbacks": callbacks})
    assert spec.trainer.trainer_kwargs() == options
    assert spec.trainer.callbacks[0].path == "lightning.pytorch.callbacks:LearningRateMonitor"
    assert RunSpec(**BASE).trainer.trainer_kwargs() == {}
    assert RunSpec(**BASE).report_metrics == ["train_loss", "loss", "train/loss", "val_*"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"trainer": {"precision": "16-true"}}, "'32-true', '16-mixed' or 'bf16-mixed'"),
        ({"trainer": {"precison": "bf16-mixed"}}, "'precison' is not a trainer option (did you mean 'prec"),
        ({"trainer": {"gradient_clip_value": 1.0}}, "(did you mean 'gradient_clip_val'?)"),
        ({"trainer": {"zzz": 1}}, "'zzz' is not a trainer option (the options are: callbacks, check_val"),
        ({"trainer": {"callbacks": "a.b:C"}}, 'a list is needed, one class per entry: callbacks=["a.b:C"]'),
        ({"trainer": {"loggers": "a.b:C"}}, 'loggers=["a.b:C"]'),
        ({"trainer": {"accumulate_grad_batches": 2}}, "raise target_batch_size instead"),
        ({"trainer": {"devices": 2}}, "one worker per device"),
        ({"trainer": {"max_epochs": 3}}, "stop condition"),
        ({"trainer": {"val_check_interval": 1.5}}, "(0, 1]"),
        ({"trainer": {"val_check_interval": 0.0}}, "(0, 1]"),
        ({"trainer": {"limit_val_batches": 1.5}}, "[0, 1]"),
        ({"trainer": {"val_check_interval": 0}}, "[1, 10^9]"),
        ({"trainer": {"val_check_interval": True}}, "not true or false"),
        ({"trainer": {"limit_val_batches": -1}}, "[0, 10^9]"),
        ({"trainer": {"gradient_clip_val": float("inf")}}, "finite"),
        ({"trainer": {"callbacks": ["not an import path"]}}, "pattern"),
        ({"trainer": {"callbacks": [{"path": "a:B", "args": {"x": float("nan")}}]}}, "not plain JSON"),
        ({"trainer": {"loggers": ["a:B"] * 17}}, "at most 16"),
        (
            {"trainer": {"gradient_clip_val": 1.0}, "strategy_options": {"reuse_grad_buffers": True}},
            "clip the sum",
        ),
        ({"report_metrics": ["val_*", "val_*"]}, "twice"),
        ({"report_metrics": [f"m{i}" for i in range(17)]}, "at most 16"),
        ({"report_metrics": ["ok", "bad\nname"]}, "printable"),
        ({"report_metrics": ["x" * 101]}, "printable"),
    ],
)
def test_trainer_options_a_worker_cannot_honour_are_refused(override: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        RunSpec(**{**BASE, **override})


def test_trainer_options_in_strategy_options_are_named() -> None:
    assert "set it in the trainer section" in str(
        trainer_option_in_strategy_options({"precision": "16-mixed"})
    )
    assert "runs cannot set" in str(trainer_option_in_strategy_options({"accumulate_grad_batches": 2}))
    assert trainer_option_in_strategy_options({"matchmaking_time": 1.0}) is None


def test_heartbeat_metrics_are_bounded_finite_and_named() -> None:
    assert Heartbeat(metrics={"val_loss": 0.5, "lr-Optimizer/pg1": 0.01}).metrics["val_loss"] == 0.5
    assert Heartbeat().metrics == {}  # a heartbeat without metrics
    for bad in ({"val_loss": float("nan")}, {"a\x00": 1.0}, {f"m{i}": 1.0 for i in range(33)}, {"": 1.0}):
        with pytest.raises(ValidationError):
            Heartbeat(metrics=bad)


def test_metrics_are_selected_by_name_or_pattern_and_bounded() -> None:
    values = {"train_loss": 1.0, "val_loss": 2.0, "val_acc": 0.5, "other": 3.0, "bad\nname": 4.0}
    expected = {"train_loss": 1.0, "val_acc": 0.5, "val_loss": 2.0}
    assert select_metrics(values, DEFAULT_REPORT_METRICS) == expected
    many = {f"val_{i:03d}": float(i) for i in range(100)}
    picked = select_metrics(many, ("val_*",))
    assert list(picked) == [f"val_{i:03d}" for i in range(32)]
    assert select_metrics({"val_loss": 1.0}, ()) == {}
