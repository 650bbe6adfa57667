"""A SIGTERM owes the run a final checkpoint wherever between two batches it lands.

Lightning's own SIGTERM handler marks the trainer, and its loop ends training with ``SIGTERMException``
at its next check, right after the batch's ``on_train_batch_end`` hooks. A signal that arrives after
the agent's hook has read the stop request, but before that check, ends training without the hook ever
seeing the stop. Here a callback placed after the agent's sends the signal at that moment, to a real
trainer with a real (lone) hivemind swarm.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from tests.support.strategy import digits, make_strategy, make_trainer
from worker.agent.callback import AgentCallback
from worker.agent.checkpoints import Checkpointer
from worker.agent.client import OrchestratorClient
from worker.agent.state import AgentState
from worker.examples.digits import DigitsModule
from worker.protocol.runs import StopCondition
from worker.protocol.workers import DeregisterReason, HeartbeatReply

SIGNAL_AT_BATCH = 3


class SignalAfterAgent(Callback):
    """Sends this process a SIGTERM at the end of batch ``at``, after the callbacks before it ran."""

    def __init__(self, at: int) -> None:
        self._at = at

    def on_train_batch_end(self, trainer: Trainer, module: LightningModule, *args: Any) -> None:
        if trainer.global_step == self._at:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.fixture
def stop_on_sigterm() -> Iterator[AgentState]:
    """An agent's state whose stop a SIGTERM requests (as the agent's own handler does)."""
    state = AgentState(checkpoint_every_epochs=100, latest_checkpoint_epoch=None)
    state.apply_reply(HeartbeatReply(checkpointer=True, checkpoint_every_epochs=100))
    previous = signal.signal(
        signal.SIGTERM, lambda signum, frame: state.request_stop(DeregisterReason.stopped, "received SIGTERM")
    )
    try:
        yield state
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.timeout(120)
def test_a_sigterm_after_the_agents_batch_hook_still_saves_the_final_checkpoint(
    tmp_path: Path, stop_on_sigterm: AgentState
) -> None:
    # no orchestrator answers: the checkpoint is kept on disk, where this test reads it
    client = OrchestratorClient("http://127.0.0.1:9", retries=0)
    kept = tmp_path / "checkpoints"
    checkpointer = Checkpointer(client, "7", stop_on_sigterm, kept, retry_interval_s=0.05)
    agent = AgentCallback(stop_on_sigterm, checkpointer, StopCondition(), target_batch_size=32)
    # a swarm epoch per batch: the state at the signal is epochs newer than any stored checkpoint
    trainer = make_trainer(
        make_strategy(target_batch_size=32),
        callbacks=[agent, SignalAfterAgent(SIGNAL_AT_BATCH)],
        max_steps=50,
        default_root_dir=tmp_path,
    )
    try:
        with pytest.raises(SystemExit):  # Lightning's SIGTERMException
            trainer.fit(DigitsModule(), datamodule=digits(batch_size=32))
        assert stop_on_sigterm.stop is not None and trainer.received_sigterm
    finally:
        checkpointer.close()
    assert checkpointer.flush(timeout_s=30)  # the upload thread gave up and kept the file
    files = sorted(p.name for p in kept.iterdir())
    assert files == [f"epoch-{SIGNAL_AT_BATCH:08d}.ckpt"], files
    state = torch.load(kept / files[0], weights_only=True)  # as the agent's resume loads it
    assert state["global_step"] == SIGNAL_AT_BATCH and state["state_dict"], sorted(state)
