"""Current spot prices per (instance type, availability zone), cached so ``describe`` stays cheap."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

log = logging.getLogger(__name__)

PRODUCT = "Linux/UNIX"


class SpotPriceCache:
    """Latest spot price in USD per instance-hour, refreshed at most every ``ttl_s`` per pool.

    A failed look-up is logged and yields ``None`` (cost unknown), never an exception: prices inform
    the status page, they must not stop the reconcile loop.
    """

    def __init__(
        self, client: Any, ttl_s: float = 300.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._client = client
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._prices: dict[tuple[str, str], tuple[float, float | None]] = {}

    def price(self, instance_type: str, zone: str) -> float | None:
        """USD per hour for ``instance_type`` in ``zone`` now, or None when EC2 does not say."""
        key = (instance_type, zone)
        now = self._clock()
        with self._lock:
            cached = self._prices.get(key)
            if cached and now - cached[0] < self._ttl_s:
                return cached[1]
        value = self._look_up(instance_type, zone)
        with self._lock:
            self._prices[key] = (now, value)
        return value

    def _look_up(self, instance_type: str, zone: str) -> float | None:
        try:
            response = self._client.describe_spot_price_history(
                InstanceTypes=[instance_type],
                AvailabilityZone=zone,
                ProductDescriptions=[PRODUCT],
                StartTime=datetime.now(UTC),
                MaxResults=5,
            )
        except ClientError as exc:
            log.warning("spot price of %s in %s unavailable: %s", instance_type, zone, exc)
            return None
        history = sorted(
            (h for h in response.get("SpotPriceHistory", []) if h.get("AvailabilityZone") == zone),
            key=lambda h: h["Timestamp"],
        )
        if not history:
            return None
        return float(history[-1]["SpotPrice"])
