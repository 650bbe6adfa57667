"""A run's averaging window and its warning (orchestrator/domain/averaging.py) on a fresh SQLite database: the
fraction is taken between stored progress samples; the warning needs a whole window below the threshold
with 2+ live workers (counted from when two had trained), is raised once, and is cleared once (recovery,
or fewer than 2 live workers)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from orchestrator.db.models import Event, ProgressSample, Run
from orchestrator.db.session import Database
from orchestrator.domain import averaging, runs
from worker.protocol.runs import RunSpec

T0 = datetime(2026, 1, 1, tzinfo=UTC)
WINDOW_S = 60.0


def new_run(db: Database) -> int:
    spec = RunSpec.model_validate(
        {"name": "r", "module": "a.b:C", "datamodule": "a.b:D", "target_batch_size": 64, "batch_size": 8}
    )
    with db.begin() as session:
        run, _ = runs.create_run(session, spec, T0)
        return run.id


def sample(
    db: Database,
    run_id: int,
    at_s: float,
    averaged: int,
    alone: int,
    live: int = 2,
    epoch: int = 0,
    samples: int = 0,
    training: int | None = None,
) -> None:
    """Store a progress sample with the run's cumulative counts (``training``: live workers that had
    stepped through an epoch, ``live`` unless given), then judge the run at that moment."""
    now = T0 + timedelta(seconds=at_s)
    with db.begin() as session:
        session.add(
            ProgressSample(
                run_id=run_id,
                at=now,
                swarm_epoch=epoch,
                samples_total=samples,
                samples_per_s=0.0,
                live_workers=live,
                averaging={
                    "averaged": averaged,
                    "alone": alone,
                    "group_size_sum": 2 * averaged,
                    averaging.TRAINING_WORKERS: live if training is None else training,
                },
            )
        )
        session.flush()
        run = session.get(Run, run_id)
        assert run is not None
        averaging.judge(session, run, now, live, WINDOW_S, 0.5)


def state(db: Database, run_id: int) -> tuple[dict, list[str]]:
    with db.begin() as session:
        run = session.get(Run, run_id)
        assert run is not None
        kinds = session.scalars(select(Event.message).where(Event.kind == averaging.EVENT_KIND)).all()
        return dict(run.averaging or {}), list(kinds)


def test_the_warning_needs_a_whole_window_then_is_raised_once_and_cleared_once(db: Database) -> None:
    run_id = new_run(db)
    sample(db, run_id, 0, averaged=0, alone=0)
    sample(db, run_id, 30, averaged=0, alone=40)
    window, events = state(db, run_id)
    assert window["averaged_fraction"] == 0.0 and not window["covered"] and window["warning"] is None
    assert events == []  # half a window: not judged yet
    sample(db, run_id, 61, averaged=1, alone=80)
    sample(db, run_id, 70, averaged=2, alone=90)
    window, events = state(db, run_id)
    assert window["covered"] and window["epochs"] == 92 and window["outcomes"]["alone"] == 90
    assert window["warning"] and "below 50%" in window["warning"] and len(events) == 1
    # the window slides: the sample at 30 s becomes its start; still below, no second event
    sample(db, run_id, 95, averaged=10, alone=120)
    window, events = state(db, run_id)
    assert window["warning"] and len(events) == 1
    # a whole window mostly averaged clears it, with one event
    sample(db, run_id, 130, averaged=200, alone=130)
    sample(db, run_id, 160, averaged=400, alone=135)
    window, events = state(db, run_id)
    assert window["warning"] is None and window["averaged_fraction"] > 0.5, window
    assert len(events) == 2 and "averaging recovered" in events[1]
    assert window["mean_group_size"] == 2.0


def test_epochs_a_first_worker_trained_before_its_partner_began_raise_no_warning(db: Database) -> None:
    # both workers registered (live), one trains alone for a while (its epochs are all 'alone') until
    # the other has imported its code and joins; from then on they average
    run_id = new_run(db)
    sample(db, run_id, 0, averaged=0, alone=0, training=0)
    sample(db, run_id, 20, averaged=0, alone=300, training=1)
    sample(db, run_id, 40, averaged=2, alone=310, training=2)
    sample(db, run_id, 70, averaged=20, alone=311, training=2)
    window, events = state(db, run_id)
    assert not window["covered"] and window["warning"] is None and events == [], window
    # a whole window since both trained, mostly averaged: judged, and no warning
    sample(db, run_id, 101, averaged=60, alone=312, training=2)
    window, events = state(db, run_id)
    assert window["covered"] and window["warning"] is None and events == [], window
    assert window["outcomes"]["alone"] == 2 and window["outcomes"]["averaged"] == 58


def test_two_workers_that_never_average_get_the_warning_a_window_after_both_trained(db: Database) -> None:
    run_id = new_run(db)
    sample(db, run_id, 0, averaged=0, alone=0, training=1)
    sample(db, run_id, 10, averaged=0, alone=100, training=2)
    sample(db, run_id, 65, averaged=0, alone=400, training=2)
    assert state(db, run_id)[0]["warning"] is None  # 65 s since the first sample, 55 s since both trained
    sample(db, run_id, 71, averaged=0, alone=450, training=2)
    window, events = state(db, run_id)
    assert window["covered"] and window["warning"] and len(events) == 1, window


def test_fewer_than_two_live_workers_clear_the_warning(db: Database) -> None:
    run_id = new_run(db)
    sample(db, run_id, 0, averaged=0, alone=0)
    sample(db, run_id, 61, averaged=0, alone=50)
    assert state(db, run_id)[0]["warning"]
    sample(db, run_id, 70, averaged=0, alone=60, live=1)
    window, events = state(db, run_id)
    assert window["warning"] is None and "fewer than 2 live workers" in events[-1]


def test_the_window_gives_the_samples_per_swarm_epoch_against_the_target(db: Database) -> None:
    run_id = new_run(db)  # target_batch_size 64
    sample(db, run_id, 0, averaged=0, alone=0, epoch=3, samples=200)
    sample(db, run_id, 30, averaged=4, alone=0, epoch=5, samples=330)
    sample(db, run_id, 61, averaged=10, alone=0, epoch=13, samples=200 + 10 * 80)
    window, _ = state(db, run_id)
    assert window["samples_per_epoch"] == pytest.approx(80.0)  # (1000 - 200) / (13 - 3)
    assert window["batch_ratio"] == pytest.approx(80 / 64)


def test_no_whole_epoch_in_the_window_gives_no_batch(db: Database) -> None:
    run_id = new_run(db)
    sample(db, run_id, 0, averaged=0, alone=0, epoch=3, samples=200)
    sample(db, run_id, 30, averaged=0, alone=0, epoch=3, samples=260)
    window, _ = state(db, run_id)
    assert window["samples_per_epoch"] is None and window["batch_ratio"] is None
