"""The DiLoCo knobs of ``HivemindStrategy`` as it runs with them; the modes, the defaults and the check
that refuses a run are :mod:`worker.protocol.sync`. Pure Python (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.protocol.sync import DEFAULT_OUTER_LR, DEFAULT_OUTER_MOMENTUM, DEFAULT_SYNC_EVERY_S


@dataclass(frozen=True)
class DiLoCoSettings:
    """The DiLoCo knobs. Rounds come every ``sync_every_steps`` local steps when it is set (equal-speed
    peers, tests), else every ``sync_every_s`` seconds by the swarm's clock."""

    sync_every_s: float = DEFAULT_SYNC_EVERY_S
    sync_every_steps: int | None = None
    outer_lr: float = DEFAULT_OUTER_LR
    outer_momentum: float = DEFAULT_OUTER_MOMENTUM


def round_matchmaking_s(settings: DiLoCoSettings, matchmaking_time: float) -> float:
    """How long before a round by time its matchmaking starts, and how long past its moment a round
    waits for a group: ``matchmaking_time``, but at most half of ``sync_every_s``, so that a round that
    found no group has ended when the next one's matchmaking starts."""
    if settings.sync_every_steps is not None:
        return matchmaking_time
    return min(matchmaking_time, settings.sync_every_s / 2)


def diloco_settings(options: dict[str, Any]) -> DiLoCoSettings:
    """The settings from checked ``options`` (None for a knob left at its default)."""
    steps = options.get("sync_every_steps")
    return DiLoCoSettings(
        sync_every_s=float(options.get("sync_every_s") or DEFAULT_SYNC_EVERY_S),
        sync_every_steps=int(steps) if steps is not None else None,
        outer_lr=float(options.get("outer_lr") or DEFAULT_OUTER_LR),
        outer_momentum=float(
            DEFAULT_OUTER_MOMENTUM if options.get("outer_momentum") is None else options["outer_momentum"]
        ),
    )
