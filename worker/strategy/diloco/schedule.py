"""When a DiLoCo round is due: every ``sync_every_steps`` local steps, or at the swarm clock's boundaries.

By time, rounds fall on the multiples of ``sync_every_s`` of hivemind's DHT time (the wall clock every
peer shares), so peers that started, joined or stalled at different moments still reach the same round
together, with nothing negotiated; a peer computes ``sync_every_s`` less the round's own cost between
two. The next round is always the first boundary still ahead, however close: its matchmaking starts
``lead_s`` before it (``settings.round_matchmaking_s``), or at once when less than that remains (a
joiner, or a round that ended late). Skipping a near boundary instead put peers out of phase for good:
one that ended its round a little late waited for the boundary after, while the others met at the
near one without it. By steps, peers of equal speed meet because they count alike (tests, benchmarks
of identical workers).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from hivemind.utils import get_dht_time

from worker.strategy.diloco.settings import DiLoCoSettings


class RoundSchedule:
    """The next round's time (by time) or the steps left to it (by steps), reset after each round."""

    def __init__(
        self, settings: DiLoCoSettings, lead_s: float, clock: Callable[[], float] = get_dht_time
    ) -> None:
        self._every_s = settings.sync_every_s
        self._every_steps = settings.sync_every_steps
        self._lead_s = lead_s
        self._clock = clock
        self.steps = 0
        self.round_at = self._next_boundary()

    @property
    def by_steps(self) -> bool:
        return self._every_steps is not None

    def _next_boundary(self) -> float:
        """The first boundary after now (a round exactly at now would have no time to match)."""
        return (math.floor(self._clock() / self._every_s) + 1) * self._every_s

    def count_step(self) -> None:
        self.steps += 1

    def due(self) -> bool:
        if self._every_steps is not None:
            return self.steps >= self._every_steps
        return self._clock() >= self.round_at

    def time_to_schedule(self) -> bool:
        """By time: the round's matchmaking should start now (``lead_s`` before it)."""
        return not self.by_steps and self._clock() >= self.round_at - self._lead_s

    def next_round(self) -> None:
        """Called when a round ended (whatever its outcome)."""
        self.steps = 0
        self.round_at = self._next_boundary()
