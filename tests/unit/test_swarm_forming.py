"""When a run's workers count as training apart (a swarm that has not formed), on both sides: the
orchestrator's judgement over its live workers' counts, and the worker's own log line."""

from __future__ import annotations

from orchestrator.domain.swarm_forming import apart, formed
from worker.agent.apart import ApartWatch
from worker.protocol.workers import AveragingCounts


def test_two_live_workers_with_only_local_epochs_are_apart_once_each_has_enough() -> None:
    first, second = AveragingCounts(alone=40), AveragingCounts(alone=4, timeout=1)
    assert apart([first, second], apart_epochs=5)
    assert not apart([first, AveragingCounts(alone=4)], apart_epochs=5)  # the late one: not yet
    assert not apart([first], apart_epochs=5)  # one worker trains alone by necessity


def test_one_averaged_epoch_anywhere_means_the_swarm_formed() -> None:
    counts = [AveragingCounts(alone=40), AveragingCounts(alone=10, averaged=1)]
    assert formed(counts) and not apart(counts, apart_epochs=5)


def test_the_worker_warns_once_per_streak_and_only_while_the_run_has_other_workers() -> None:
    now = [0.0]
    watch = ApartWatch(min_epochs=3, min_s=30.0, clock=lambda: now[0])
    assert watch.update(AveragingCounts(alone=5), live_workers=1) is None  # alone in the run: fine
    assert watch.update(AveragingCounts(alone=6), live_workers=2) is None  # its partner may still boot
    now[0] = 29.0
    assert watch.update(AveragingCounts(alone=8), live_workers=2) is None
    now[0] = 31.0
    said = watch.update(AveragingCounts(alone=9), live_workers=2)
    assert said is not None and said.startswith("training alone: the last 9 epochs"), said
    assert "31 s of them while the run had 2 live workers" in said
    assert watch.update(AveragingCounts(alone=12), live_workers=2) is None  # said once
    assert watch.update(AveragingCounts(alone=12, averaged=1), live_workers=2) == (
        "averaging again: this worker's latest epoch was averaged with its peers"
    )
    now[0] = 100.0
    assert watch.update(AveragingCounts(alone=16, averaged=1), live_workers=2) is None  # a new streak
    now[0] = 131.0
    assert watch.update(AveragingCounts(alone=17, averaged=1), live_workers=2) is not None
