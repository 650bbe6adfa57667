"""A small in-memory token-bucket rate limiter (per key), e.g. registrations per join token.

Each key's bucket holds at most ``burst`` tokens and refills at ``rate_per_s``; :meth:`RateLimiter.take`
spends one or raises :class:`TooManyRequests` saying when the next one is due (the API answers 429 with
``Retry-After``). The state lives in this process only: several orchestrators behind one address each
allow the full rate. Buckets that have refilled completely are forgotten, so keys cost memory only
while they are busy.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from orchestrator.errors import TooManyRequests


class RateLimiter:
    """Token buckets by key; thread-safe."""

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)

    def take(self, key: str, what: str = "requests") -> None:
        """Spend one token of ``key``'s bucket; raises :class:`TooManyRequests` when it is empty."""
        with self._lock:
            now = self._clock()
            self._forget_full(now)
            tokens, at = self._buckets.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate_per_s)
            if tokens < 1.0:
                wait_s = (1.0 - tokens) / self.rate_per_s
                self._buckets[key] = (tokens, now)
                raise TooManyRequests(
                    f"too many {what}: at most {self.burst} at once and {self.rate_per_s:g} per second; "
                    f"retry in {math.ceil(wait_s)} s",
                    retry_after_s=wait_s,
                )
            self._buckets[key] = (tokens - 1.0, now)

    def _forget_full(self, now: float) -> None:
        full_after_s = self.burst / self.rate_per_s
        self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < full_after_s}
