"""``GET /api/v1/runs/{name}/progress`` shows churn: the desired worker count at each point, the marks of
a worker that left after a spot notice and of one that was lost, and the run's goodput. The app
in-process, on SQLite and on PostgreSQL."""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import Any

import pytest

from tests.api.conftest import BOTH_BACKENDS
from tests.support import api
from tests.support.inprocess import InProcessOrchestrator as Orchestrator
from tests.support.specs import create_run
from tests.support.waiting import wait_until
from tests.support.workers import heartbeat, mark_lost, register

pytestmark = pytest.mark.parametrize("backend", BOTH_BACKENDS, indirect=True)
TARGET_BATCH = 64


def progress(api_app: Orchestrator, name: str) -> dict[str, Any]:
    with api_app.client() as http:
        response = http.get(api.run_progress(name))
    assert response.status_code == 200, response.text
    return dict(response.json())


@pytest.mark.timeout(60)
def test_progress_shows_desired_workers_notice_and_loss_marks(api_app: Orchestrator) -> None:
    name, join = create_run(api_app, "churn", desired_workers=2, max_workers=4)
    noticed, lost = register(api_app, join), register(api_app, join)
    for worker in (noticed, lost):
        heartbeat(api_app, worker, swarm_epoch=1, samples=10)
    wait_until(lambda: progress(api_app, name)["points"], 20, message="a first progress sample")
    with api_app.admin() as http:
        assert http.post(api.run_scale(name), json={"desired_workers": 3}).status_code == 200
    with api_app.client(noticed["worker_token"]) as http:
        left = http.post(
            api.deregister(noticed["worker_id"]),
            json={"reason": "interrupted", "message": "spot interruption notice: terminate at 12:00:00Z"},
        )
    assert left.status_code == 204, left.text
    mark_lost(api_app, lost["worker_id"], "no heartbeat for 10 s")

    def sampled_after_scaling() -> dict[str, Any] | None:
        series = progress(api_app, name)
        return series if series["points"][-1]["desired_workers"] == 3 else None

    series = wait_until(sampled_after_scaling, 20, message="a progress sample after the scale")
    desired = [p["desired_workers"] for p in series["points"]]
    assert desired[0] == 2 and desired == sorted(desired)
    marks = [(m["kind"], m["worker_id"]) for m in series["marks"]]
    assert marks == [("notice", noticed["worker_id"]), ("loss", lost["worker_id"])]
    assert "spot interruption notice" in series["marks"][0]["reason"]
    assert series["marks"][1]["reason"] == "no heartbeat for 10 s"
    assert series["marks"][0]["at"] <= series["marks"][1]["at"]


def steady_epochs_until_goodput(
    api_app: Orchestrator, name: str, worker: dict[str, Any], sync: str
) -> dict[str, Any]:
    """Heartbeat one swarm epoch more every 0.4 s until the run's progress shows a goodput; its series.
    In DiLoCo each epoch (round) keeps ``TARGET_BATCH`` samples of the 2 x ``TARGET_BATCH`` trained."""
    epochs = itertools.count(1)
    kept_per_epoch = TARGET_BATCH if sync == "diloco" else 0

    def measured() -> dict[str, Any] | None:
        epoch = next(epochs)
        samples = (2 if sync == "diloco" else 1) * TARGET_BATCH * epoch
        counts = {"averaged": epoch, "kept_samples": kept_per_epoch * epoch}
        heartbeat(api_app, worker, swarm_epoch=epoch, samples=samples, samples_per_s=10.0, averaging=counts)
        series = progress(api_app, name)
        return series if series["goodput"] else None

    return wait_until(measured, 40, interval_s=0.4, message="goodput over steady epochs")


def kept_samples(point: dict[str, Any]) -> int:
    """A point's kept samples: none where it holds no counts (no worker had reported any), as the API says."""
    return int((point["averaging"] or {"kept_samples": 0})["kept_samples"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sync", ["gradients", "diloco"])
def test_goodput_is_measured_once_a_steady_swarm_completed_epochs(api_app: Orchestrator, sync: str) -> None:
    """In gradients mode an epoch is ``target_batch_size`` samples; in DiLoCo a round is an epoch, and
    the samples in the model are those the workers report as kept (here half of a round's 2 x
    ``target_batch_size``, so that reading rounds as batches would give another figure)."""
    name, join = create_run(
        api_app, "goodput", target_batch_size=TARGET_BATCH, strategy_options={"sync": sync}
    )
    worker = register(api_app, join)
    assert progress(api_app, name)["goodput"] is None
    series = steady_epochs_until_goodput(api_app, name, worker, sync)
    goodput, points = series["goodput"], series["points"]
    assert len(points) == series["stored_points"]  # not downsampled: the figures can be checked here
    times = [datetime.fromisoformat(p["at"]) for p in points]
    spans = [(times[i] - times[i - 1]).total_seconds() for i in range(1, len(times))]
    held = sum(p["live_workers"] * span for p, span in zip(points, spans, strict=False))
    assert goodput["worker_s"] == pytest.approx(held)
    assert goodput["window_s"] == pytest.approx((times[-1] - times[0]).total_seconds())
    epochs_done = points[-1]["swarm_epoch"] - points[0]["swarm_epoch"]
    if sync == "diloco":
        kept = [kept_samples(p) for p in points]
        assert goodput["progress_samples"] == kept[-1] - kept[0] == epochs_done * TARGET_BATCH
    else:
        assert goodput["progress_samples"] == epochs_done * TARGET_BATCH
    rate = goodput["steady_samples_per_worker_s"]
    assert goodput["value"] == pytest.approx(goodput["progress_samples"] / (rate * held))
    # one worker heartbeating an epoch at a time: about its steady pace throughout
    assert 0.3 < goodput["value"] < 1.5


@pytest.mark.timeout(60)
def test_a_sample_before_the_first_heartbeat_has_no_counts_and_goodput_counts_from_none_kept(
    api_app: Orchestrator,
) -> None:
    """A DiLoCo run sampled between its first registration and that worker's first heartbeat: the point
    has no averaging counts, and goodput's progress counts every sample kept since (its worker-seconds
    count the wait too: the worker was held)."""
    name, join = create_run(
        api_app, "early", target_batch_size=TARGET_BATCH, strategy_options={"sync": "diloco"}
    )
    worker = register(api_app, join)
    first = wait_until(lambda: progress(api_app, name)["points"], 20, message="a sample before any heartbeat")
    assert first[0]["averaging"] is None
    series = steady_epochs_until_goodput(api_app, name, worker, "diloco")
    points = series["points"]
    assert len(points) == series["stored_points"] and points[0]["averaging"] is None
    assert kept_samples(points[0]) == 0
    assert (
        series["goodput"]["progress_samples"]
        == kept_samples(points[-1])
        == points[-1]["swarm_epoch"] * TARGET_BATCH
    )
