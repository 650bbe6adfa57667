"""How a run's workers' time splits between compute and waiting on averaging: a worker's cumulative
seconds (``OutcomeCounter``), a window's difference of the run's summed seconds, the share waiting and G
(compute per round over the round's cost) that the run view, page and CLI show."""

from __future__ import annotations

import pytest

from orchestrator.domain.averaging import summarize, time_split
from worker.strategy.outcomes import Outcome, OutcomeCounter


def test_g_is_compute_over_waiting_and_the_share_is_waiting_over_training() -> None:
    # 10 rounds of 9 s compute and 1 s waiting each: G = 9, a tenth of the time waiting
    assert time_split(100.0, 10.0) == {"train_s": 100.0, "averaging_s": 10.0, "waiting_share": 0.1, "g": 9.0}
    # gradients mode on a small model: a 50 ms epoch per 1 s round, G about 0.05
    split = time_split(105.0, 100.0)
    assert split["g"] == pytest.approx(0.05) and split["waiting_share"] == pytest.approx(100 / 105)
    assert time_split(30.0, 0.0)["g"] is None  # never waited: G unbounded, not a number
    assert time_split(0.0, 0.0) == {"train_s": 0.0, "averaging_s": 0.0, "waiting_share": None, "g": None}


def test_a_window_takes_the_difference_of_the_runs_summed_seconds() -> None:
    oldest = {"averaged": 4, "train_s": 50.0, "averaging_s": 5.0}
    newest = {"averaged": 10, "train_s": 110.0, "averaging_s": 17.0}
    window = summarize(newest, oldest, 60.0, covered=True)
    assert window["train_s"] == 60.0 and window["averaging_s"] == 12.0
    assert window["waiting_share"] == pytest.approx(0.2) and window["g"] == pytest.approx(4.0)
    # counts without seconds (none measured yet) give no share, not a zero
    assert summarize({"averaged": 3}, None, 60.0, covered=False)["waiting_share"] is None


def test_a_worker_counts_training_seconds_from_its_start_and_the_blocked_ones_within() -> None:
    now = [100.0]
    counter = OutcomeCounter(clock=lambda: now[0])
    counter.add_blocked(5.0)  # before training starts (joining the swarm): not training time
    counter.add(Outcome.alone)
    assert (counter.snapshot().train_s, counter.snapshot().averaging_s) == (0.0, 0.0)
    counter.start()
    now[0] = 130.0
    counter.add_blocked(3.0)
    counter.add_blocked(1.5)
    snapshot = counter.snapshot()
    assert (snapshot.train_s, snapshot.averaging_s, snapshot.alone) == (30.0, 4.5, 1)
