"""When a worker validates, and that its validation results reach its reports.

A worker validates every minute of its training by default (Lightning's default, the end of each local
pass, can be many minutes away on a real data set), and once more as it stops: the results of that last
validation have no training batch after them, so the agent's callback publishes them itself. Here with a
real trainer and a real (lone) hivemind swarm.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from tests.support.strategy import digits, make_strategy, make_trainer
from worker.agent.callback import AgentCallback
from worker.agent.checkpoints import Checkpointer
from worker.agent.client import OrchestratorClient
from worker.agent.state import AgentState
from worker.examples.digits import DigitsModule
from worker.protocol.runs import StopCondition
from worker.protocol.trainer import DEFAULT_VAL_CHECK_INTERVAL_S, TrainerSection


def test_a_run_that_sets_no_cadence_validates_every_minute_of_training() -> None:
    assert DEFAULT_VAL_CHECK_INTERVAL_S <= 60
    assert TrainerSection().validation_cadence() == {"val_check_interval": timedelta(seconds=60)}
    # a cadence of the run's own is kept, Lightning's end-of-pass one included
    for section in ({"val_check_interval": 1.0}, {"val_check_interval": 20}, {"check_val_every_n_epoch": 2}):
        assert TrainerSection.model_validate(section).validation_cadence() == {}


@pytest.mark.timeout(120)
def test_the_validation_a_worker_runs_as_it_stops_reaches_its_last_report(tmp_path: Path) -> None:
    state = AgentState(checkpoint_every_epochs=100)
    client = OrchestratorClient("http://127.0.0.1:9", retries=0)  # nothing is uploaded: not the checkpointer
    checkpointer = Checkpointer(client, "7", state, tmp_path / "checkpoints", retry_interval_s=0.05)
    # a swarm epoch per batch: the run's target is met at the third batch, long before a minute passed
    agent = AgentCallback(state, checkpointer, StopCondition(target_epochs=3), target_batch_size=32)
    trainer = make_trainer(
        make_strategy(target_batch_size=32),
        callbacks=[agent],
        max_steps=200,
        default_root_dir=tmp_path,
        limit_val_batches=2,
        **TrainerSection().validation_cadence(),
    )
    try:
        trainer.fit(DigitsModule(), datamodule=digits(batch_size=32))
    finally:
        checkpointer.close()
    assert state.stop is not None and trainer.global_step < 10, "the run's target ended training"
    last_report = state.heartbeat()
    assert {"val_loss", "val_acc"} <= set(last_report.metrics), last_report.metrics
    assert last_report.metrics["val_loss"] == pytest.approx(float(trainer.callback_metrics["val_loss"]))
