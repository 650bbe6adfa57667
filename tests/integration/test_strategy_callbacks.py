"""Stock Lightning callbacks and loggers with HivemindStrategy, in real training runs of a lone peer.

``LearningRateMonitor`` reads the optimizer's ``defaults`` and ``param_groups``: with hivemind's
optimizer (built around the module's one, or rebuilt by hivemind when it offloads) it logs the swarm's
learning rate. ``ModelCheckpoint`` and ``EarlyStopping`` are refused for a run's workers (the reasons are
in ``worker/protocol/trainer.py``); the classes a run names are checked the same way on both sides.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from tests.support.strategy import digits, make_strategy, make_trainer
from worker.agent.metrics import ReportingLogger, reported_metrics
from worker.examples.digits import DigitsModule
from worker.protocol.trainer import TrainerPlugin, TrainerPluginError, build_plugins, plugin_class_problem

pytestmark = pytest.mark.timeout(120)  # a lone peer: it runs in the other lane (tests/support/lanes.py)


class ScheduledDigits(DigitsModule):
    """Digits with SGD (momentum) and a step schedule: LearningRateMonitor then reads the schedule."""

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, 2, 0.5)  # the strategy steps it per swarm epoch
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


@pytest.mark.parametrize("offload", [False, True], ids=["wrapped-optimizer", "hivemind-built-optimizer"])
def test_learning_rate_monitor_logs_the_swarm_learning_rate(tmp_path: Path, offload: bool) -> None:
    monitor = LearningRateMonitor(logging_interval="step", log_momentum=True)
    reporting = ReportingLogger()
    strategy = make_strategy(target_batch_size=32, offload_optimizer=offload)
    trainer = make_trainer(
        strategy,
        callbacks=[monitor],
        logger=[CSVLogger(tmp_path), reporting],
        max_steps=4,
        log_every_n_steps=1,
    )
    trainer.fit(DigitsModule(lr=0.01), digits())
    assert strategy.optimizer.local_epoch == 4
    assert monitor.lrs["lr-Optimizer"] == [0.01] * 4  # hivemind's optimizer class names the series
    assert trainer.callback_metrics["lr-Optimizer-momentum"] == pytest.approx(0.9)  # Adam's beta1
    with open(Path(trainer.loggers[0].log_dir) / "metrics.csv") as handle:
        logged = [row["lr-Optimizer"] for row in csv.DictReader(handle) if row.get("lr-Optimizer")]
    assert [float(value) for value in logged] == pytest.approx([0.01] * 4)
    # what a worker reports: the lr monitor's series, picked by a run's report_metrics
    picked = reported_metrics(trainer.callback_metrics, reporting.latest, ("lr-*", "train_loss"))
    assert set(picked) == {"lr-Optimizer", "lr-Optimizer-momentum", "train_loss"}


def test_learning_rate_monitor_follows_a_schedule_by_swarm_epoch() -> None:
    monitor = LearningRateMonitor(logging_interval="step")
    strategy = make_strategy(target_batch_size=32)  # one swarm epoch per batch
    trainer = make_trainer(
        strategy, callbacks=[monitor], logger=ReportingLogger(), max_steps=5, log_every_n_steps=1
    )
    trainer.fit(ScheduledDigits(lr=0.4), digits())
    assert monitor.lrs["lr-SGD"] == pytest.approx([0.4, 0.4, 0.2, 0.2, 0.1])  # halved every 2 epochs
    assert monitor.lrs["lr-Optimizer"] == monitor.lrs["lr-SGD"]  # hivemind's view of the same groups


@pytest.mark.parametrize("refused", [ModelCheckpoint, EarlyStopping])
def test_model_checkpoint_and_early_stopping_are_refused_with_the_reason(refused: type) -> None:
    class Custom(refused):  # type: ignore[valid-type,misc]
        pass

    for target in (refused, Custom):
        problem = plugin_class_problem(target, "callback")
        assert problem is not None and problem.startswith(f"{refused.__name__} is not supported: ")
    assert plugin_class_problem(LearningRateMonitor, "callback") is None
    assert plugin_class_problem(CSVLogger, "logger") is None
    assert "Logger subclass" in str(plugin_class_problem(LearningRateMonitor, "logger"))


def test_plugins_are_built_with_their_arguments_or_refused_with_the_field() -> None:
    (monitor,) = build_plugins(
        [
            TrainerPlugin(
                path=f"{LearningRateMonitor.__module__}:LearningRateMonitor",
                args={"logging_interval": "epoch"},
            )
        ],
        "callback",
    )
    assert isinstance(monitor, LearningRateMonitor) and monitor.logging_interval == "epoch"
    bad = [
        (TrainerPlugin(path="lightning.pytorch.callbacks:ModelCheckpoint"), "is not supported"),
        (TrainerPlugin(path="lightning.pytorch.callbacks:Nothing"), "cannot import"),
        (TrainerPlugin(path="lightning.pytorch.callbacks:LearningRateMonitor", args={"x": 1}), "'x'"),
        # binds, but the class refuses the value
        (
            TrainerPlugin(
                path="lightning.pytorch.callbacks:LearningRateMonitor", args={"logging_interval": 3}
            ),
            "logging_interval",
        ),
    ]
    for plugin, message in bad:
        with pytest.raises(TrainerPluginError, match=message):
            build_plugins([plugin], "callback")


def test_a_logger_whose_package_is_missing_names_the_runs_requirement_not_pip() -> None:
    # Lightning's WandbLogger without wandb (not in this venv) says "Try running `pip install -U ...`",
    # which would install it on no worker: the fix is the run's requirements
    with pytest.raises(TrainerPluginError) as caught:
        build_plugins([TrainerPlugin(path="lightning.pytorch.loggers:WandbLogger")], "logger")
    message = str(caught.value)
    assert "--requirement 'wandb>=" in message and "pip install" not in message, message
