"""Run code of the worker-lifecycle tests: the digits example (at the tests' steady pace:
``tests/support/paced_digits.py``) with a common user habit or a bug.

- :class:`SeededDigitsModule` calls ``seed_everything(42)`` in ``__init__`` and writes the first batch it
  trains on, with the worker context it saw, to ``record_dir/<worker id>.json``.
- :class:`CrashingDigitsModule` raises the same error once it has trained ``crash_after_batches`` batches
  for at least ``crash_after_s`` seconds (long enough for a heartbeat to report its samples).
- :class:`GpuOnlyDigitsModule` refuses to be built (it wants a GPU the workers do not have): a spec the
  create-time check passes (it never builds the module) and no worker can use.
- :class:`NoAveragingDigitsModule` blocks its worker's gradient averager: the worker trains alone.
- :class:`ApartDigitsModule` has its workers look for gradient groupmates under keys of their own: each
  round waits out ``averaging_timeout`` without a group.
- :class:`SplitDigitsModule` has its workers keep their progress records apart: each trains alone.
"""

from __future__ import annotations

import time
from pathlib import Path

from lightning.pytorch import seed_everything
from torch import Tensor

from tests.support.paced_digits import PacedDigitsModule
from worker.context import current_worker
from worker.examples.digits import DigitsDataModule
from worker.files import write_json

__all__ = ["CrashingDigitsModule", "DigitsDataModule", "GpuOnlyDigitsModule", "SeededDigitsModule"]


class SeededDigitsModule(PacedDigitsModule):
    def __init__(self, record_dir: str, **kwargs: float) -> None:
        seed_everything(42)
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.record_dir = Path(record_dir)
        self.recorded = False

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        if not self.recorded:
            self.recorded = True
            ctx = current_worker()
            assert ctx is not None, "the agent publishes the worker context before the module is built"
            record = {
                "worker_id": ctx.worker_id,
                "worker_index": ctx.worker_index,
                "num_workers": ctx.num_workers,
                "labels": batch[1].tolist(),
                "features_sum": float(batch[0].sum()),
            }
            # whole or not at all: the test reads a record as soon as it is there
            write_json(self.record_dir / f"{ctx.worker_id}.json", record)
        return super().training_step(batch, batch_idx)


class GpuOnlyDigitsModule(PacedDigitsModule):
    def __init__(self, **kwargs: float) -> None:
        raise ValueError("this model needs a GPU, and this worker has none")


class CrashingDigitsModule(PacedDigitsModule):
    def __init__(self, crash_after_batches: int = 5, crash_after_s: float = 4.0, **kwargs: float) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.crash_after_batches = crash_after_batches
        self.crash_after_s = crash_after_s
        self.batches = 0
        self.started_at: float | None = None

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        self.started_at = self.started_at or time.monotonic()
        self.batches += 1
        trained_s = time.monotonic() - self.started_at
        if self.batches > self.crash_after_batches and trained_s > self.crash_after_s:
            raise RuntimeError("the model diverged in a buggy layer")
        return super().training_step(batch, batch_idx)


def _refuse_round(**kwargs: object) -> None:
    raise RuntimeError("this worker's averager is blocked by the test")


class NoAveragingDigitsModule(PacedDigitsModule):
    """Digits whose worker can never average: its gradient averager refuses every round (hivemind then
    applies local gradients), so the swarm trains as N models."""

    def on_train_start(self) -> None:
        averager = self.trainer.strategy.optimizer.grad_averager  # type: ignore[attr-defined]
        averager.schedule_step = lambda **kwargs: None  # no pre-scheduled round
        averager.step = _refuse_round


class ApartDigitsModule(PacedDigitsModule):
    """Digits whose workers never meet in a gradient round: each looks for groupmates under the group
    bits of its slot's parity (hivemind's key is ``<prefix>.0b<bits>``), so two workers of a run both
    count each other and both wait out ``averaging_timeout`` in every round."""

    def on_train_start(self) -> None:
        ctx = current_worker()
        assert ctx is not None, "the agent publishes the worker context before training starts"
        averager = self.trainer.strategy.optimizer.grad_averager  # type: ignore[attr-defined]
        averager.set_group_bits(str(ctx.worker_index % 2))


class ApartStateDigitsModule(PacedDigitsModule):
    """Digits whose workers never meet in a state round (run with ``average_state_every=1``): gradient
    rounds are refused (local gradients, at once) and each state averager looks for groupmates under the
    group bits of its slot's parity, so both workers wait out ``averaging_timeout`` in a state round
    after every epoch, a round hivemind starts itself rather than ahead of time."""

    def on_train_start(self) -> None:
        ctx = current_worker()
        assert ctx is not None, "the agent publishes the worker context before training starts"
        optimizer = self.trainer.strategy.optimizer  # type: ignore[attr-defined]
        optimizer.grad_averager.schedule_step = lambda **kwargs: None  # no pre-scheduled gradient round
        optimizer.grad_averager.step = _refuse_round
        optimizer.state_averager.set_group_bits(str(ctx.worker_index % 2))


class SplitDigitsModule(PacedDigitsModule):
    """Digits whose workers never see each other's progress, as in a split swarm: each reports and reads
    its progress records under a DHT key of its own, so each counts itself alone and applies every epoch
    on its own gradients (outcome ``alone``), however many workers the run has."""

    def on_train_start(self) -> None:
        ctx = current_worker()
        assert ctx is not None, "the agent publishes the worker context before training starts"
        tracker = self.trainer.strategy.optimizer.tracker  # type: ignore[attr-defined]
        tracker.training_progress_key = f"{tracker.prefix}_{ctx.worker_id}_progress"
