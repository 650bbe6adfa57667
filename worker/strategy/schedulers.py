"""Learning-rate schedulers that follow the swarm's epoch instead of this peer's batches.

With hivemind, parameters change once per swarm epoch (``target_batch_size`` samples from all peers),
so a schedule written as "step every update" must advance once per swarm epoch, and a peer that
joins late (or resumes from a checkpoint) must land on the same learning rate as everyone else.
``SwarmEpochScheduler`` wraps a scheduler returned by ``configure_optimizers`` and does exactly that.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from torch.optim.lr_scheduler import LRScheduler

from worker.protocol.checkpoints import SCHEDULER_INNER_KEY, SCHEDULER_SWARM_EPOCH_KEY

_SWARM_EPOCH_KEY = SCHEDULER_SWARM_EPOCH_KEY
_INNER_KEY = SCHEDULER_INNER_KEY


class SwarmEpochScheduler:
    """Keeps ``scheduler`` at the swarm epoch reported by ``epoch_fn`` (hivemind ``local_epoch``).

    ``step()`` (what Lightning and users call) only catches up with the epoch; calling it many times
    per epoch is harmless. One epoch forward is one ``scheduler.step()``. Any other jump, or a
    learning rate changed behind the scheduler's back (hivemind loaded parameter groups from a peer),
    replays the schedule from its first epoch so the result matches a peer that never left.
    Other attributes (``optimizer``, ``get_last_lr``...) are the wrapped scheduler's.
    """

    def __init__(self, scheduler: LRScheduler, epoch_fn: Callable[[], int]) -> None:
        self.scheduler = scheduler
        self._epoch_fn = epoch_fn
        self._first_state = copy.deepcopy(scheduler.state_dict())
        self._first_lrs = self._current_lrs()
        self.swarm_epoch = 0
        self._lrs_set = self._first_lrs
        self.sync()

    def __getattr__(self, name: str) -> Any:
        # only called for attributes not found on the wrapper itself
        try:
            inner = self.__dict__["scheduler"]
        except KeyError:
            raise AttributeError(name) from None
        return getattr(inner, name)

    def _current_lrs(self) -> list[float]:
        return [float(group["lr"]) for group in self.scheduler.optimizer.param_groups]

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Catch up with the swarm epoch; arguments (epoch, metrics) are ignored."""
        self.sync()

    def sync(self) -> None:
        """Advance (or replay) the wrapped scheduler to the current swarm epoch."""
        epoch = int(self._epoch_fn())
        if epoch == self.swarm_epoch and self._current_lrs() == self._lrs_set:
            return
        if epoch == self.swarm_epoch + 1 and self._current_lrs() == self._lrs_set:
            self.scheduler.step()
        else:
            self._replay(epoch)
        self.swarm_epoch = epoch
        self._lrs_set = self._current_lrs()

    def _replay(self, epoch: int) -> None:
        self.scheduler.load_state_dict(copy.deepcopy(self._first_state))
        for group, lr in zip(self.scheduler.optimizer.param_groups, self._first_lrs, strict=True):
            group["lr"] = lr
        for _ in range(epoch):
            self.scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        """The wrapped scheduler's state and the swarm epoch it corresponds to."""
        return {_INNER_KEY: self.scheduler.state_dict(), _SWARM_EPOCH_KEY: self.swarm_epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state from ``state_dict()`` or, for checkpoints of plain Lightning, the bare scheduler's."""
        if _INNER_KEY in state_dict and _SWARM_EPOCH_KEY in state_dict:
            self.scheduler.load_state_dict(state_dict[_INNER_KEY])
            self.swarm_epoch = int(state_dict[_SWARM_EPOCH_KEY])
        else:
            self.scheduler.load_state_dict(state_dict)
            self.swarm_epoch = int(self._epoch_fn())
        self._lrs_set = self._current_lrs()
        self.sync()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.scheduler!r}, swarm_epoch={self.swarm_epoch})"
