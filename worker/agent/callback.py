"""The agent's Lightning callback: the training thread's side of the agent.

Before the first batch it seeds this worker's sampling apart from the others' (:mod:`worker.context`).
Between batches (the only safe point), and after each validation, it publishes a progress snapshot for
the heartbeat thread; between batches it also saves the checkpointer's checkpoints, notices the run's
stop condition, and ends training when a stop was requested (after a final checkpoint when this worker
is the checkpointer and time allows), also when Lightning's own SIGTERM check ends training first.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.exceptions import SIGTERMException

from worker.agent.apart import ApartWatch
from worker.agent.checkpoints import Checkpointer
from worker.agent.metrics import ReportingLogger, read_loss, reported_metrics
from worker.agent.state import AgentState
from worker.context import current_worker, seed_sampling
from worker.protocol.metrics import DEFAULT_REPORT_METRICS
from worker.protocol.runs import StopCondition
from worker.protocol.workers import DeregisterReason

logger = logging.getLogger(__name__)

FINAL_CHECKPOINT_MIN_S = 5.0  # skip the final checkpoint when the deadline is closer than this


class AgentCallback(Callback):
    """Connects the Lightning training loop of one worker to the agent's shared state."""

    def __init__(
        self,
        state: AgentState,
        checkpointer: Checkpointer,
        stop_condition: StopCondition,
        target_batch_size: int,
        snapshot_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        report_metrics: tuple[str, ...] = DEFAULT_REPORT_METRICS,
        worker_id: str | None = None,
    ) -> None:
        self._state = state
        self._worker_id = worker_id
        self._report_metrics = tuple(report_metrics)
        #: add it to the Trainer's loggers: what callbacks log there (not in callback_metrics) is reported
        self.reporting_logger = ReportingLogger()
        self._checkpointer = checkpointer
        self._stop_condition = stop_condition
        self._target_batch_size = target_batch_size
        self._snapshot_interval_s = snapshot_interval_s
        self._clock = clock
        self._last_snapshot = -math.inf
        self._rate_origin: tuple[float, int] | None = None
        self._apart = ApartWatch()

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # After the user's module and datamodule were built and set up (a seed_everything(42) there would
        # give every worker the same batches), before the training dataloader's first batch is fetched.
        if self._worker_id is not None:
            seed = seed_sampling(self._worker_id)
            logger.info("sampling seeded for this worker (seed %d)", seed)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        strategy: Any = trainer.strategy
        # a worker told to leave waits in no averaging round: its peers may be leaving too
        self._state.on_stop(strategy.leave_averaging)
        self._rate_origin = (self._clock(), int(strategy.local_samples))
        self._state.update_progress(phase="training", visible_maddrs=tuple(strategy.visible_maddrs()))
        self._snapshot(trainer)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._clock() - self._last_snapshot >= self._snapshot_interval_s:
            self._snapshot(trainer)
        local_epoch = self._local_epoch(trainer)
        self._leave_after_last_round(trainer)
        stop = self._state.stop
        if stop is None and self._condition_reached(trainer):
            self._state.request_stop(DeregisterReason.completed, "the run reached its stop condition")
            trainer.strategy.keep_progress_record = True  # type: ignore[attr-defined]
            stop = self._state.stop
        if stop is not None:
            self._save_final_if_owed(trainer)
            self._snapshot(trainer)
            trainer.should_stop = True
            return
        if self._checkpointer.due(local_epoch):
            self._checkpointer.save(trainer, local_epoch)

    def _leave_after_last_round(self, trainer: Trainer) -> None:
        """A worker with a spot notice leaves once no averaging round of its remains before its leave: in
        DiLoCo what it trains after its last round is never averaged in, so training on until the leave
        would only lose it (and the swarm gets its replacement sooner)."""
        early = self._state.early_leave
        if early is None:
            return
        next_round_at = getattr(trainer.strategy, "next_round_at", lambda: None)()
        if next_round_at is not None and next_round_at > early.at:
            logger.info(
                "spot notice: no round of this worker's before it leaves (the next at %.0f s after its "
                "leave); leaving after its last round",
                next_round_at - early.at,
            )
            early.now()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """A validation's results reach the heartbeat now, not at the next training batch: the one a
        worker runs as it stops (Lightning validates once more when ``should_stop`` is set) has no next
        batch, and its values would never leave the worker."""
        if not trainer.sanity_checking and self._rate_origin is not None:
            self._snapshot(trainer)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        """A SIGTERM that lands after :meth:`on_train_batch_end` read the stop request ends training
        with Lightning's ``SIGTERMException`` at its next check, between batches, before the hook sees
        the stop: the final checkpoint is owed all the same (the trainer is not torn down yet)."""
        if isinstance(exception, SIGTERMException):
            self._save_final_if_owed(trainer)

    def _save_final_if_owed(self, trainer: Trainer) -> None:
        """Save the final checkpoint when this worker checkpoints, its state is newer than the stored
        one, and the stop's deadline leaves time to upload it."""
        stop = self._state.stop
        local_epoch = self._local_epoch(trainer)
        if (
            stop is not None
            and self._checkpointer.needs_final(local_epoch)
            and stop.deadline - self._clock() > FINAL_CHECKPOINT_MIN_S
        ):
            self._checkpointer.save(trainer, local_epoch)

    @staticmethod
    def _local_epoch(trainer: Trainer) -> int:
        optimizer = getattr(trainer.strategy, "optimizer", None)
        return int(getattr(optimizer, "local_epoch", 0) or 0)

    def _condition_reached(self, trainer: Trainer) -> bool:
        epoch = max(self._state.progress.swarm_epoch, self._local_epoch(trainer))
        return self._stop_condition.reached(epoch, self._target_batch_size)

    def _snapshot(self, trainer: Trainer) -> None:
        """Publish progress for the heartbeat thread (cheap reads only)."""
        now = self._clock()
        self._last_snapshot = now
        strategy: Any = trainer.strategy
        swarm = strategy.swarm_progress()
        samples = int(strategy.local_samples)
        rate = 0.0
        if self._rate_origin is not None and now > self._rate_origin[0]:
            rate = max(0.0, (samples - self._rate_origin[1]) / (now - self._rate_origin[0]))
        local_epoch = self._local_epoch(trainer)
        outcomes = strategy.averaging_outcomes()
        self._state.update_progress(
            local_step=int(trainer.global_step),
            # this peer's epoch is part of the swarm's (right after a resume the tracker lags behind it)
            swarm_epoch=max(int(swarm.epoch), local_epoch),
            local_epoch=local_epoch,
            samples=samples,
            loss=read_loss(trainer.callback_metrics),
            metrics=reported_metrics(
                trainer.callback_metrics, self.reporting_logger.latest, self._report_metrics
            ),
            samples_per_s=rate,
            num_peers=int(swarm.num_peers),
            averaging=outcomes,
        )
        context = current_worker()
        said = self._apart.update(outcomes, context.num_workers if context else 1)
        if said:
            logger.warning("worker %s: %s", self._worker_id, said)
