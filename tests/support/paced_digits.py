"""The digits example at a steady pace: the model of the tests' digits runs (``tests.support.runs``).

A worker of the example trains flat out: on a 2-core machine two of them take every core, and a run's
timeline (rounds every few seconds, heartbeats, matchmaking) is what a test waits for, not its compute.
Each training step of :class:`PacedDigitsModule` takes at least ``step_s`` of wall time and sleeps through
what its computation leaves, as a worker whose accelerator does the work leaves its CPU idle; and it
computes on one torch thread (a step of this MLP takes under a millisecond on one core, and a worker's
default of a thread per core, on cores every other worker shares, spends most of its CPU with its
threads waiting on each other). Two swarm tests then run side by side (``tests/support/lanes.py``). The
tests of the example itself (the demo's, the documented commands', the benchmarks' smoke tests) train it
as it ships.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from worker.examples.digits import DigitsModule

#: wall time per training step: 32 samples a step make 1,600 samples a second per worker, which fills
#: a test's swarm epochs (128-2,048 samples) and rounds (2 s) many times over
STEP_S = 0.02


class PacedDigitsModule(DigitsModule):
    """:class:`~worker.examples.digits.DigitsModule` whose steps start at most once every ``step_s``."""

    def __init__(self, hidden: int = 64, lr: float = 0.01, depth: int = 1, step_s: float = STEP_S) -> None:
        super().__init__(hidden=hidden, lr=lr, depth=depth)
        torch.set_num_threads(1)  # the worker's process is built for this run's module alone
        self.step_s = step_s
        self._last_start: float | None = None

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        now = time.monotonic()
        if self._last_start is not None and (wait := self._last_start + self.step_s - now) > 0:
            time.sleep(wait)
        self._last_start = time.monotonic()
