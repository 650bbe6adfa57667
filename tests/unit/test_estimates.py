"""A run's cost and ETA as the server computes them (orchestrator/domain/estimates.py): the API's run
and worker views, the status page, the CLI and /metrics all show these values."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orchestrator.domain.estimates import eta_s, price_per_hour, worker_cost_usd
from orchestrator.domain.states import RunState
from worker.protocol.runs import StopCondition

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def eta(state: RunState = RunState.running, rate: float = 100.0, **stop: int) -> float | None:
    """5000 samples so far at ``rate``; the swarm is in epoch 5 (the DHT; workers said 4), which holds 200
    samples already; 1000 samples per epoch."""
    return eta_s(
        state,
        StopCondition.model_validate(stop),
        1000,
        samples_total=5000,
        samples_per_s=rate,
        swarm_epoch=5,
        samples_in_epoch=200,
    )


def test_eta_takes_the_sooner_target_and_is_unknown_without_one() -> None:
    assert eta(target_samples=6000) == pytest.approx(10.0)
    # epochs: (10 - 5) epochs * 1000 samples - 200 already in epoch 5 = 4800 samples at 100/s
    assert eta(target_epochs=10) == pytest.approx(48.0)
    assert eta(target_epochs=10, target_samples=6000) == pytest.approx(10.0)
    assert eta(target_samples=4000) == 0.0  # past the target: due now, never negative
    assert eta() is None
    assert eta(rate=0.0, target_samples=6000) is None
    assert eta(RunState.stopped, target_samples=6000) is None
    assert eta(RunState.stopping, target_samples=6000) == pytest.approx(10.0)


def cost(details: dict[str, Any] | None, hours: float, ended_after_h: float | None = None) -> float | None:
    start = NOW - timedelta(hours=hours)
    ended = start + timedelta(hours=ended_after_h) if ended_after_h is not None else None
    return worker_cost_usd(details, start, start - timedelta(hours=1), ended, NOW)


def test_cost_is_price_times_hours_from_registration_and_unknown_without_a_price() -> None:
    assert cost({"price_usd_per_hour": 0.5}, 2) == pytest.approx(1.0)
    assert cost({"price_usd_per_hour": 0.5}, 2, ended_after_h=1) == pytest.approx(0.5)
    assert cost({"price_per_hour": 2}, 2) == pytest.approx(4.0)
    assert cost({}, 2) is None and cost(None, 2) is None
    assert cost({"price_usd_per_hour": "0.5"}, 2) is None  # not a number: unknown, not a crash
    assert cost({"price_usd_per_hour": True}, 2) is None
    never_registered = worker_cost_usd({"price_usd_per_hour": 1.0}, None, NOW - timedelta(hours=3), None, NOW)
    assert never_registered == pytest.approx(3.0)  # from its launch


def test_with_both_price_keys_price_usd_per_hour_wins() -> None:
    """The docs name price_usd_per_hour (EC2 spot) and accept price_per_hour too: with both set, the
    first wins, for the API, the page, the CLI and /metrics alike."""
    both = {"price_per_hour": 9.0, "price_usd_per_hour": 0.25}
    assert price_per_hour(both) == 0.25
    assert cost(both, 4) == pytest.approx(1.0)
    assert price_per_hour({"price_per_hour": 9.0, "price_usd_per_hour": "n/a"}) == 9.0
