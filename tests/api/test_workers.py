"""``/api/v1/workers``: registration (join and launch tokens), heartbeats, deregistration, the checkpointer
election, progress samples and reported metrics, as workers see them and the run's reads show them.
The app in-process, on SQLite and on PostgreSQL."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.clock import utc_now
from orchestrator.db.session import Database
from orchestrator.domain import runs, workers
from tests.api.conftest import BOTH_BACKENDS
from tests.support import api
from tests.support.inprocess import InProcessOrchestrator as Orchestrator
from tests.support.orchestrator import HAND_ONLY
from tests.support.specs import create_run
from tests.support.waiting import wait_until
from tests.support.workers import heartbeat, register, swarm_token_peer_id
from worker.protocol.runs import RunSpec

pytestmark = pytest.mark.parametrize("backend", BOTH_BACKENDS, indirect=True)
CHECKPOINT_MAX_BYTES = 256 * 1024
ANNOUNCED = "/ip4/203.0.113.7/tcp/31330/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"
ORCHESTRATOR_ENV = {
    **HAND_ONLY,
    "SPOTSWARM_CHECKPOINT_MAX_BYTES": str(CHECKPOINT_MAX_BYTES),
    "SPOTSWARM_HEARTBEAT_TIMEOUT_S": "4",
    # the orchestrator's own address in the peer lists (the null DHT has none of its own)
    "SPOTSWARM_DHT_ANNOUNCE_MADDRS": ANNOUNCED,
}


def create(api_app: Orchestrator, **overrides: Any) -> tuple[str, str]:
    return create_run(api_app, "w", **overrides)


def get_run(api_app: Orchestrator, name: str) -> dict[str, Any]:
    with api_app.client() as http:
        return dict(http.get(api.run(name)).json())


@pytest.mark.timeout(60)
def test_manual_worker_registers_heartbeats_and_is_shown(api_app: Orchestrator) -> None:
    name, join = create(api_app)
    worker = register(api_app, join, hostname="gpu-1")
    assert worker["swarm_id"].startswith(name) and worker["run"]["name"] == name
    assert worker["initial_peers"] == api_app.peers() and worker["heartbeat_interval_s"] == 1
    assert worker["resume_checkpoint"] is None
    # its DHT peer's address, with the peer id its swarm token was issued for (any other is dropped)
    maddr = f"/ip4/127.0.0.1/tcp/4242/p2p/{swarm_token_peer_id(api_app, worker)}"
    reply = heartbeat(
        api_app,
        worker,
        local_step=7,
        swarm_epoch=2,
        samples=320,
        loss=0.5,
        samples_per_s=40.0,
        num_peers=1,
        visible_maddrs=[maddr],
    )
    assert reply["action"] == "continue" and reply["checkpoint_every_epochs"] == 5
    run = wait_until(lambda: (r := get_run(api_app, name))["reported"]["samples_total"] == 320 and r, 10)
    assert run["state"] == "running" and run["workers"]["running"] == 1
    assert run["reported"] == {
        "swarm_epoch": 2,
        "samples_total": 320,
        "loss": 0.5,
        "samples_per_s": 40.0,
        "metrics": {},
    }
    with api_app.client() as http:
        listed = http.get(api.run_workers(name)).json()
        peers = http.get(api.run_peers(name)).json()
    assert listed["total"] == 1 and listed["items"][0]["manual"] and listed["items"][0]["hostname"] == "gpu-1"
    assert "token" not in str(listed).lower()
    assert peers["worker_peers"] == [maddr]
    assert peers["initial_peers"] == api_app.peers() + peers["worker_peers"]


@pytest.mark.timeout(60)
def test_the_first_worker_of_a_two_worker_run_shards_by_the_runs_desired_workers(
    api_app: Orchestrator,
) -> None:
    _name, join = create(api_app, desired_workers=2)
    first = register(api_app, join)
    # it took every sample until its partner came (num_workers 1): now half from the start
    assert (first["worker_index"], first["num_workers"]) == (0, 2)
    assert heartbeat(api_app, first)["num_workers"] == 2
    second, third = (
        register(api_app, join),
        register(api_app, join),
    )  # a hand-joined third runs beyond desired
    assert (second["num_workers"], third["worker_index"], third["num_workers"]) == (2, 2, 3)
    wait_until(lambda: heartbeat(api_app, first)["num_workers"] == 3, 10, message="three running workers")


@pytest.mark.timeout(60)
def test_workers_get_a_stable_slot_and_heartbeats_tell_the_live_count(api_app: Orchestrator) -> None:
    name, join = create(api_app)
    first = register(api_app, join)
    second = register(api_app, join)
    assert (first["worker_index"], first["num_workers"]) == (0, 1)
    assert (second["worker_index"], second["num_workers"]) == (1, 2)
    wait_until(lambda: heartbeat(api_app, first)["num_workers"] == 2, 10, message="two running workers")
    with api_app.client(second["worker_token"]) as http:
        left = http.post(api.deregister(second["worker_id"]), json={"reason": "interrupted"})
    assert left.status_code == 204, left.text
    wait_until(lambda: heartbeat(api_app, first)["num_workers"] == 1, 10, message="one running worker")
    third = register(api_app, join)
    assert (third["worker_index"], third["num_workers"]) == (1, 2)  # the slot second left
    with api_app.client() as http:
        listed = http.get(api.run_workers(name)).json()["items"]
    assert {w["id"]: w["worker_index"] for w in listed} == {
        first["worker_id"]: 0,
        second["worker_id"]: 1,
        third["worker_id"]: 1,
    }


@pytest.mark.timeout(60)
def test_registration_binds_to_the_launch_intent(api_app: Orchestrator) -> None:
    name, _ = create(api_app)
    database = Database(api_app.db_url or f"sqlite:///{api_app.data_dir / 'spotswarm.db'}")
    try:
        with database.begin() as session:
            run = runs.get_run(session, name)
            by_request = workers.create_launch_intent(session, run, utc_now(), {"zone": "test-1a"})
            by_token = workers.create_launch_intent(session, run, utc_now())
            ids = (by_request.worker.id, by_request.worker.request_id, by_token.worker.id, by_token.token)
            first_token = by_request.token
    finally:
        database.close()
    first = register(api_app, first_token, request_id=ids[1], launcher_handle="pid-1")
    second = register(api_app, ids[3])  # the launch token alone identifies the row
    assert (first["worker_id"], second["worker_id"]) == (str(ids[0]), str(ids[2]))
    assert second["worker_token"].startswith("ssw_") and ids[3].startswith("ssl_")  # a fresh worker token
    with api_app.admin() as http:  # the full view: launch details beyond the public keys
        items = {w["id"]: w for w in http.get(api.run_workers(name)).json()["items"]}
    assert items[str(ids[0])]["state"] == "running" and items[str(ids[0])]["launch_details"] == {
        "zone": "test-1a"
    }
    assert items[str(ids[0])]["launcher_handle"] == "pid-1" and not items[str(ids[0])]["manual"]
    assert heartbeat(api_app, first)["action"] == "continue"


@pytest.mark.timeout(60)
def test_exactly_one_checkpointer_and_another_takes_over(api_app: Orchestrator) -> None:
    name, join = create(api_app)
    pool = [register(api_app, join) for _ in range(3)]

    def checkpointers() -> list[str]:
        return [w["worker_id"] for w in pool if heartbeat(api_app, w)["checkpointer"]]

    first = wait_until(lambda: (c := checkpointers()) and c, 10)
    assert len(first) == 1 and get_run(api_app, name)["checkpointer_worker_id"] == first[0]
    leaving = next(w for w in pool if w["worker_id"] == first[0])
    with api_app.client(leaving["worker_token"]) as http:
        assert http.post(api.deregister(first[0]), json={"reason": "interrupted"}).status_code == 204
    pool.remove(leaving)
    second = wait_until(lambda: (c := checkpointers()) and c, 10)
    assert len(second) == 1 and second != first


@pytest.mark.timeout(60)
def test_worker_endpoints_accept_only_that_workers_token(api_app: Orchestrator) -> None:
    _, join = create(api_app)
    a, b = register(api_app, join), register(api_app, join)
    path = api.heartbeat(a["worker_id"])
    for token, status in [(None, 401), (b["worker_token"], 403), (join, 403), (api_app.admin_token, 403)]:
        with api_app.client(token) as http:
            response = http.post(path, json={})
            assert response.status_code == status, (token, response.text)
            assert "action" not in response.text
    with api_app.client("ssj_not-a-real-token") as http:
        assert http.post(api.register(), json={}).status_code == 401


@pytest.mark.timeout(60)
def test_deregister_reasons_map_to_worker_states(api_app: Orchestrator) -> None:
    name, join = create(api_app)
    expected = {"interrupted": "interrupted", "stopped": "exited", "completed": "exited", "error": "failed"}
    ids = {}
    for reason in expected:
        worker = register(api_app, join)
        with api_app.client(worker["worker_token"]) as http:
            body = {"reason": reason, "message": "boom" if reason == "error" else None}
            assert http.post(api.deregister(worker["worker_id"]), json=body).status_code == 204
        assert heartbeat(api_app, worker)["action"] == "stop"  # an ended worker is told to stop
        ids[worker["worker_id"]] = reason
    with api_app.client() as http:
        items = http.get(api.run_workers(name)).json()["items"]
        events = http.get(api.run_events(name), params={"limit": 1000}).json()["items"]
    for item in items:
        assert item["state"] == expected[ids[item["id"]]] and item["ended_at"]
    assert next(i for i in items if ids[i["id"]] == "error")["exit_reason"] == "error: boom"
    assert sum(e["kind"] == "worker.state" for e in events) >= 4


@pytest.mark.timeout(60)
def test_stop_tells_workers_to_stop_and_the_run_stops_when_they_leave(api_app: Orchestrator) -> None:
    name, join = create(api_app)
    worker = register(api_app, join)
    with api_app.admin() as http:
        assert http.post(api.run_stop(name)).json()["state"] == "stopping"
    assert heartbeat(api_app, worker)["action"] == "stop"
    with api_app.client(join) as http:
        assert http.post(api.register(), json={}).status_code == 409
    with api_app.client(worker["worker_token"]) as http:
        http.post(api.deregister(worker["worker_id"]), json={"reason": "stopped"})
    assert get_run(api_app, name)["state"] == "stopped"


@pytest.mark.timeout(60)
def test_progress_is_sampled_and_downsampled(api_app: Orchestrator) -> None:
    name, join = create(api_app)
    worker = register(api_app, join)
    step = itertools.count(1)

    def enough_points() -> bool:
        n = next(step)
        heartbeat(
            api_app, worker, local_step=n, swarm_epoch=n, samples=10 * n, loss=1.0 / n, samples_per_s=5.0
        )
        with api_app.client() as http:
            return int(http.get(api.run_progress(name)).json()["stored_points"]) >= 4

    wait_until(enough_points, 30, interval_s=0.3)
    with api_app.client() as http:
        series = http.get(api.run_progress(name), params={"max_points": 3}).json()
    points = series["points"]
    assert len(points) == 3 and series["stored_points"] >= 4
    assert [p["at"] for p in points] == sorted(p["at"] for p in points)
    assert points[-1]["samples_total"] >= points[0]["samples_total"] and points[-1]["live_workers"] == 1


def metric_series(api_app: Orchestrator) -> dict[tuple[str, str], float]:
    """The ``spotswarm_run_metric`` series of ``/metrics``: (run, name) -> value."""
    with api_app.client() as http:
        families = text_string_to_metric_families(http.get("/metrics").text)
        family = next(f for f in families if f.name == "spotswarm_run_metric")
    return {(s.labels["run"], s.labels["name"]): s.value for s in family.samples}


@pytest.mark.timeout(60)
def test_reported_metrics_are_shown_per_worker_and_run_and_kept_when_the_run_stops(
    api_app: Orchestrator,
) -> None:
    name, join = create(api_app, report_metrics=["train_loss", "val_*"])
    first, second = register(api_app, join), register(api_app, join)

    def report() -> None:
        """Both workers' reports; sent again before each step that needs them fresh (this module's
        heartbeat timeout is 4 s, and the waits below can take longer on a busy machine)."""
        # what the run did not ask for is dropped: names become label values of /metrics
        heartbeat(
            api_app, first, loss=1.0, metrics={"val_loss": 0.75, "train_loss": 1.0, "secret_thing": 9.0}
        )
        heartbeat(api_app, second, loss=3.0, metrics={"val_loss": 0.25, "val_acc": 0.5})

    report()

    def shown() -> dict[str, Any] | None:
        run = get_run(api_app, name)
        return run if run["reported"]["metrics"].get("val_acc") == 0.5 else None

    run = wait_until(shown, 10)
    assert run["reported"]["metrics"] == {"train_loss": 1.0, "val_acc": 0.5, "val_loss": 0.5}
    assert run["reported"]["loss"] == 2.0
    with api_app.client() as http:
        items = http.get(api.run_workers(name)).json()["items"]
        progress = api.run_progress(name)
        # samples are taken on a timer: wait for one taken after both reports were applied
        sampled = wait_until(
            lambda: [p for p in http.get(progress).json()["points"] if "val_acc" in (p["metrics"] or {})], 20
        )
    assert {w["id"]: w["metrics"] for w in items} == {
        first["worker_id"]: {"train_loss": 1.0, "val_loss": 0.75},
        second["worker_id"]: {"val_acc": 0.5, "val_loss": 0.25},
    }
    assert sampled[-1]["metrics"] == {"train_loss": 1.0, "val_acc": 0.5, "val_loss": 0.5}

    def scraped() -> dict[tuple[str, str], float] | None:
        """/metrics reads the database, which has a heartbeat a flush after the API took it: report and
        scrape until a scrape shows both workers fresh (a slow wait above may have let them go stale)."""
        report()
        series = metric_series(api_app)
        return series if (name, "val_loss") in series else None

    series = wait_until(scraped, 10, interval_s=0.5)
    assert series[(name, "val_loss")] == 0.5 and (name, "secret_thing") not in series

    report()
    with api_app.admin() as http:
        assert http.post(api.run_stop(name)).json()["state"] == "stopping"
    for worker, val_loss in ((first, 0.5), (second, 0.3)):  # the final reports, as agents leave
        assert (
            heartbeat(api_app, worker, loss=0.9, phase="stopping", metrics={"val_loss": val_loss})["action"]
            == "stop"
        )
        with api_app.client(worker["worker_token"]) as http:
            http.post(api.deregister(worker["worker_id"]), json={"reason": "stopped"})
    stopped = get_run(api_app, name)
    assert stopped["state"] == "stopped" and stopped["workers"]["live"] == 0
    assert stopped["reported"]["loss"] == pytest.approx(0.9)
    assert stopped["reported"]["metrics"] == {"val_loss": pytest.approx(0.4)}
    assert metric_series(api_app)[(name, "val_loss")] == pytest.approx(0.4)


@pytest.mark.timeout(60)
def test_a_run_whose_workers_left_before_the_stop_keeps_its_last_sampled_values(
    api_app: Orchestrator,
) -> None:
    name, join = create(api_app)
    worker = register(api_app, join)
    heartbeat(api_app, worker, loss=0.7, metrics={"val_loss": 0.6})
    with api_app.client() as http:
        progress = api.run_progress(name)
        wait_until(lambda: any(p["metrics"] for p in http.get(progress).json()["points"]), 10)
        http.headers["Authorization"] = f"Bearer {worker['worker_token']}"
        http.post(api.deregister(worker["worker_id"]), json={"reason": "stopped"})
    with api_app.admin() as http:
        stopped = http.post(api.run_stop(name)).json()
    assert stopped["state"] == "stopped"
    assert stopped["reported"]["loss"] == 0.7 and stopped["reported"]["metrics"] == {"val_loss": 0.6}


def deregister(api_app: Orchestrator, worker: dict[str, Any], **body: Any) -> None:
    with api_app.client(worker["worker_token"]) as http:
        response = http.post(api.deregister(worker["worker_id"]), json=body)
    assert response.status_code == 204, response.text


@pytest.mark.timeout(60)
def test_a_metric_no_live_worker_reports_keeps_its_last_value_as_workers_leave_and_the_run_resumes(
    api_app: Orchestrator,
) -> None:
    name, join = create(api_app, report_metrics=["train_loss", "val_*"])
    validated, training = register(api_app, join), register(api_app, join)
    heartbeat(api_app, validated, loss=1.0, metrics={"train_loss": 1.0, "val_loss": 0.6})
    deregister(api_app, validated, reason="stopped")  # scaled down: the one worker that had validated

    def shown(worker: dict[str, Any], loss: float) -> dict[str, float] | None:
        heartbeat(api_app, worker, loss=loss, metrics={"train_loss": loss})  # fresh, and never validated
        metrics = dict(get_run(api_app, name)["reported"]["metrics"])
        return metrics if metrics.get("train_loss") == loss else None

    assert wait_until(lambda: shown(training, 2.0), 10) == {"train_loss": 2.0, "val_loss": 0.6}
    # its deregistration carries what it holds as it leaves: the validation it ran as it stopped
    with api_app.admin() as http:
        assert http.post(api.run_stop(name)).json()["state"] == "stopping"
    heartbeat(api_app, training, loss=1.5, phase="stopping", metrics={"train_loss": 1.5})
    deregister(
        api_app, training, reason="stopped", metrics={"train_loss": 1.5, "val_loss": 0.45, "other": 1.0}
    )
    stopped = get_run(api_app, name)
    assert stopped["state"] == "stopped"
    assert stopped["reported"]["metrics"] == {"train_loss": 1.5, "val_loss": 0.45}
    # resumed, and stopped again before its new worker validated: the run still shows the last val_loss
    with api_app.admin() as http:
        assert http.post(api.run_resume(name)).json()["state"] == "pending"
    resumed = register(api_app, join)
    assert wait_until(lambda: shown(resumed, 0.9), 10) == {"train_loss": 0.9, "val_loss": 0.45}
    with api_app.admin() as http:
        http.post(api.run_stop(name))
    heartbeat(api_app, resumed, loss=0.8, phase="stopping", metrics={"train_loss": 0.8})
    deregister(api_app, resumed, reason="stopped")
    again = get_run(api_app, name)
    assert again["state"] == "stopped"
    assert again["reported"]["metrics"] == {"train_loss": 0.8, "val_loss": 0.45}


@pytest.mark.timeout(60)
def test_registration_sends_the_runs_trainer_section_and_report_metrics(api_app: Orchestrator) -> None:
    _, join = create(api_app, trainer={"precision": "bf16-mixed"}, report_metrics=["val_loss"])
    used = register(api_app, join)["run"]
    assert used["trainer"]["precision"] == "bf16-mixed" and used["report_metrics"] == ["val_loss"]
    assert RunSpec.model_validate(used).trainer.trainer_kwargs() == {"precision": "bf16-mixed"}
