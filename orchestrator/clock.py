"""Time as a value passed in: services take a ``Clock``, so tests and the reconciler share one "now"."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    """The current time, timezone-aware in UTC (the default clock)."""
    return datetime.now(UTC)
