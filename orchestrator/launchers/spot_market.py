"""A simulated spot market: how many worker slots a spot pool offers at each moment.

The ``local`` launcher obeys it (:mod:`orchestrator.launchers.spot_local`) so that the reconciler's
back-off, the workers' spot notices and the events are exercised end to end on one machine, as on EC2.
Capacity comes from a trace or from a seeded random walk:

- Parcae's JSON lines (github.com/JF-D/Parcae, ``aws/traces/``): one ``[t_ms, kind, {"nodes": [...]}]``
  per line, where ``kind`` is ``add`` or ``remove`` (of the nodes listed) or ``no-op`` / ``migration``
  (no change of the fleet);
- a CSV ``time,capacity``: Parcae's ``p3.csv`` has no header and times in milliseconds; a header row
  names the unit (``minute``, ``s`` or ``ms``);
- a random market (no trace): every ``random_interval_s`` of trace time (on average), one node comes or
  goes, between none and ``random_peak_nodes``.

Trace time runs ``compress`` times faster than the wall clock, from the first time the market is asked
(the first launch). The capacity at a moment is ``round(slots * nodes / peak)``, where ``peak`` is the
most nodes the trace ever has, so any fleet size maps onto the slots this machine can run.
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

#: EC2's interruption notice: two minutes before the instance is reclaimed.
EC2_NOTICE_S = 120.0
RANDOM_HORIZON_S = 100 * 24 * 3600.0  # a random market's schedule is drawn this far ahead, once
_CSV_UNITS_S = {"minute": 60.0, "minutes": 60.0, "min": 60.0, "s": 1.0, "second": 1.0, "ms": 0.001}


class SpotMarketError(ValueError):
    """A market description or trace that cannot be used (unreadable file, bad line, no capacity ever)."""


class SpotMarketSettings(BaseModel):
    """What a simulated market replays, read from the JSON file named by ``local_spot_market``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    slots: int = Field(ge=1, le=1024, description="Workers this machine runs when the trace is at its peak.")
    trace: Path | None = Field(
        default=None, description="Parcae JSON-lines or CSV capacity trace; none: a seeded random market."
    )
    compress: float = Field(default=1.0, gt=0, le=10_000, description="Trace seconds per wall second.")
    seed: int = Field(default=0, description="Seeds the choice of reclaimed workers and the random market.")
    notice_s: float = Field(
        default=EC2_NOTICE_S, ge=0, le=3600, description="Trace seconds from a notice to termination."
    )
    kill_share: float = Field(
        default=0.0, ge=0, le=1, description="Share of reclaims that kill -9 at once, without a notice."
    )
    follow: bool = Field(
        default=False,
        description="Read lines appended to the trace while it runs; a line whose time has passed applies "
        "at once (a live market another program writes).",
    )
    random_interval_s: float = Field(
        default=300.0, gt=0, description="Random market: mean trace seconds between capacity changes."
    )
    random_peak_nodes: int = Field(default=4, ge=1, le=1024, description="Random market: most nodes.")


Schedule = list[tuple[float, int]]  # (trace second, nodes from then on), in time order


def parse_trace(text: str, name: str = "trace") -> Schedule:
    """The node count over trace time of a Parcae JSON-lines or CSV trace; SpotMarketError if unreadable."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    if lines[0].startswith("["):
        return _parse_parcae(lines, name)
    return _parse_csv(lines, name)


def _parse_parcae(lines: Sequence[str], name: str) -> Schedule:
    nodes: set[str] = set()
    schedule: Schedule = []
    for number, line in enumerate(lines, 1):
        try:
            t_ms, kind, body = json.loads(line)
            listed = {str(node) for node in body.get("nodes", [])}
            at_s = float(t_ms) / 1000.0
        except (ValueError, TypeError, AttributeError) as exc:
            raise SpotMarketError(f"{name} line {number}: not [t_ms, kind, {{nodes: [...]}}]: {exc}") from exc
        if kind == "add":
            nodes |= listed
        elif kind == "remove":
            nodes -= listed
        elif kind not in {"no-op", "migration"}:
            raise SpotMarketError(f"{name} line {number}: unknown event {kind!r}")
        schedule.append((at_s, len(nodes)))
    return schedule


def _parse_csv(lines: Sequence[str], name: str) -> Schedule:
    rows = list(csv.reader(lines))
    unit_s = 0.001  # Parcae's p3.csv: milliseconds, no header
    if rows and rows[0] and not _is_number(rows[0][0]):
        unit = rows[0][0].strip().lower().removeprefix("t_")
        if unit not in _CSV_UNITS_S:
            raise SpotMarketError(f"{name}: unknown time unit {rows[0][0]!r} (minute, s or ms)")
        unit_s, rows = _CSV_UNITS_S[unit], rows[1:]
    schedule: Schedule = []
    for number, row in enumerate(rows, 1):
        try:
            schedule.append((float(row[0]) * unit_s, int(row[1])))
        except (ValueError, IndexError) as exc:
            raise SpotMarketError(f"{name} row {number}: not time,capacity: {row}") from exc
    return schedule


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def random_schedule(settings: SpotMarketSettings, horizon_s: float, rng: random.Random) -> Schedule:
    """A seeded random walk of the node count over ``horizon_s`` trace seconds, starting at the peak."""
    nodes, at_s = settings.random_peak_nodes, 0.0
    schedule: Schedule = [(0.0, nodes)]
    while at_s < horizon_s:
        at_s += rng.expovariate(1.0 / settings.random_interval_s)
        nodes = min(settings.random_peak_nodes, max(0, nodes + rng.choice((-1, 1))))
        schedule.append((at_s, nodes))
    return schedule


class SpotMarket:
    """Capacity over wall time, with the seeded draw of which workers a shrinking market reclaims.

    ``clock`` gives wall seconds; the trace starts at the first :meth:`capacity` call. With ``follow``
    the trace file is read again when it grows. Not thread-safe: its launcher holds a lock.
    """

    def __init__(self, settings: SpotMarketSettings, clock: Callable[[], float]) -> None:
        self.settings = settings
        self._clock = clock
        self.rng = random.Random(settings.seed)
        self._started_at: float | None = None
        self._trace_size = -1
        self._schedule: Schedule = []
        self.peak = 0  # the most nodes the trace has (so far, with follow)
        if settings.trace is None:
            self._schedule = random_schedule(settings, RANDOM_HORIZON_S, random.Random(settings.seed))
            self.peak = settings.random_peak_nodes
        else:
            self._read_trace()
            if not settings.follow and not self._schedule:
                raise SpotMarketError(f"{settings.trace}: the trace has no events")

    @property
    def end_s(self) -> float:
        """The trace time of its last event (0 for an empty trace)."""
        return self._schedule[-1][0] if self._schedule else 0.0

    @property
    def started(self) -> bool:
        """Whether the trace's clock runs (it starts at the first :meth:`capacity`)."""
        return self._started_at is not None

    def trace_s(self) -> float:
        """Trace seconds since the market started (0 before)."""
        if self._started_at is None:
            return 0.0
        return (self._clock() - self._started_at) * self.settings.compress

    def capacity(self) -> int:
        """Slots the market offers now: ``round(slots * nodes / peak)``; starts the market's clock."""
        now = self._clock()
        if self._started_at is None:
            self._started_at = now
        if self.settings.follow:
            self._read_trace()
        trace_s = (now - self._started_at) * self.settings.compress
        nodes = 0
        for at_s, count in self._schedule:
            if at_s > trace_s:
                break
            nodes = count
        if self.peak <= 0:
            return 0
        return round(self.settings.slots * nodes / self.peak)

    def notice_wall_s(self) -> float:
        """Wall seconds from a notice to the termination."""
        return self.settings.notice_s / self.settings.compress

    def draw(self, candidates: Sequence[str], count: int) -> list[str]:
        """``count`` of ``candidates`` to reclaim, by the seeded draw (sorted first: same seed, same pick)."""
        return self.rng.sample(sorted(candidates), min(count, len(candidates)))

    def kill_without_notice(self) -> bool:
        """Whether this reclaim is a kill -9 without notice (``kill_share`` of them, seeded)."""
        return self.settings.kill_share > 0 and self.rng.random() < self.settings.kill_share

    def _read_trace(self) -> None:
        path = self.settings.trace
        assert path is not None
        try:
            size = path.stat().st_size
            if size == self._trace_size:
                return
            text = path.read_text()
        except OSError as exc:
            raise SpotMarketError(f"cannot read the trace {path}: {exc}") from exc
        if self.settings.follow:
            text = text[: text.rfind("\n") + 1]  # a line still being written is read next time
        schedule = parse_trace(text, str(path))
        self._trace_size, self._schedule = size, schedule
        self.peak = max([self.peak, *(nodes for _, nodes in schedule)])
