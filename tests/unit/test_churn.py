"""Goodput and the desired count over time (``orchestrator/domain/churn.py``), on sample series whose
answer is known."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.domain.churn import Sample, desired_at, goodput, steady_rate

T0 = datetime(2026, 1, 1, tzinfo=UTC)
BATCH = 100  # samples per swarm epoch


def series(*stretches: tuple[int, int, float]) -> list[Sample]:
    """Samples every 10 s: each stretch is (seconds, live workers, epochs per second per worker)."""
    out, t, progress = [], 0.0, 0.0
    for seconds, live, rate in stretches:
        for _ in range(int(seconds // 10)):
            out.append(Sample(T0 + timedelta(seconds=t), int(progress), live))
            t += 10
            progress += rate * live * 10
    out.append(Sample(T0 + timedelta(seconds=t), int(progress), stretches[-1][1]))
    return out


@pytest.mark.timeout(10)
def test_a_steady_swarm_has_goodput_one() -> None:
    measured = goodput(series((600, 4, 0.01)), BATCH)
    assert measured is not None
    assert measured.value == pytest.approx(1.0, abs=0.05)
    assert measured.steady_samples_per_worker_s == pytest.approx(1.0, rel=0.05)  # 0.01 epochs x 100


@pytest.mark.timeout(10)
def test_a_stall_after_a_loss_lowers_goodput_by_the_time_lost() -> None:
    # 4 workers for 600 s, then one is lost and the swarm makes no progress for 300 s, then 3 go on
    samples = series((600, 4, 0.01), (300, 3, 0.0), (600, 3, 0.01))
    measured = goodput(samples, BATCH)
    assert measured is not None
    held = 4 * 600 + 3 * 300 + 3 * 600
    assert measured.worker_s == pytest.approx(held)
    assert measured.value == pytest.approx((4 * 600 + 3 * 600) / held, abs=0.03)


@pytest.mark.timeout(10)
def test_goodput_covers_the_last_hour_only() -> None:
    # a stall two hours ago no longer counts
    samples = series((600, 2, 0.0), (3600 * 2, 2, 0.01))
    measured = goodput(samples, BATCH)
    assert measured is not None and measured.window_s == pytest.approx(3600)
    assert measured.value == pytest.approx(1.0, abs=0.05)


@pytest.mark.timeout(10)
def test_goodput_is_unknown_without_a_steady_stretch_of_epochs() -> None:
    assert goodput([], BATCH) is None
    assert goodput(series((600, 3, 0.0)), BATCH) is None  # no epoch completed
    # the live count changes at every sample: no stretch stands still for two epochs
    churning = [Sample(T0 + timedelta(seconds=10 * i), i, 1 + i % 2) for i in range(30)]
    assert steady_rate(churning, BATCH) is None and goodput(churning, BATCH) is None


@pytest.mark.timeout(10)
def test_in_diloco_goodput_counts_the_samples_rounds_kept_not_the_rounds() -> None:
    # rounds every 10 s whatever the workers: 2 workers keep 1 sample a second each for 600 s, then one of
    # them is lost mid-round and the other trains alone, its rounds still 10 s apart, for 600 s
    samples, kept = [], 0
    for i in range(121):
        live = 2 if i < 60 else 1
        samples.append(Sample(T0 + timedelta(seconds=10 * i), i, live, kept))
        kept += 10 * live if i != 60 else 0  # the round the loss broke kept nothing
    measured = goodput(samples, BATCH)
    assert measured is not None
    assert measured.steady_samples_per_worker_s == pytest.approx(1.0)
    assert measured.progress_samples == 2 * 600 + 590
    assert measured.value == pytest.approx(1790 / 1800, abs=0.01)
    # read as rounds x BATCH, as in gradients mode, the lone worker's stretch would look twice as fast
    assert steady_rate([Sample(s.at, s.epoch, s.live) for s in samples], BATCH) == pytest.approx(10.0)


@pytest.mark.timeout(10)
def test_the_desired_count_at_each_moment_follows_the_scale_events() -> None:
    times = [T0 + timedelta(seconds=s) for s in (0, 10, 20, 30)]
    scaled = [
        (T0 + timedelta(seconds=5), "desired 2 -> 4 (min 1, max 8)"),
        (T0 + timedelta(seconds=25), "desired 4 -> 3 (min 1, max 8)"),
    ]
    assert desired_at(times, scaled, current=3) == [2, 4, 4, 3]
    assert desired_at(times, [], current=5) == [5, 5, 5, 5]
