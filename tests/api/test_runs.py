"""``/api/v1/runs``: create, list, read, scale, stop, resume, delete, events; bad input; the admin rule;
database failures. The app in-process on SQLite and on PostgreSQL, with the import check on."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from sqlalchemy import create_engine, select, text
from sqlalchemy.orm import Session

from orchestrator.db.models import Run
from tests.api.conftest import BOTH_BACKENDS
from tests.support import api
from tests.support.inprocess import InProcessOrchestrator as Orchestrator
from tests.support.orchestrator import NO_RECONCILE
from tests.support.specs import run_spec

pytestmark = pytest.mark.parametrize("backend", BOTH_BACKENDS, indirect=True)
# The import check on (its probe shared by the module's apps, see conftest.import_checks); a small body limit.
ORCHESTRATOR_ENV = {**NO_RECONCILE, "SPOTSWARM_MAX_BODY_BYTES": "65536"}
IMPORT_CHECKS = True
_names = itertools.count()


def new_name(prefix: str = "run") -> str:
    return f"{prefix}-{next(_names)}"


def create(api_app: Orchestrator, name: str, **overrides: Any) -> dict[str, Any]:
    with api_app.admin() as http:
        response = http.post(api.runs(), json=run_spec(name, **overrides))
    assert response.status_code == 201, response.text
    return dict(response.json())


@pytest.mark.timeout(60)
def test_create_returns_the_join_token_once(api_app: Orchestrator) -> None:
    created = create(api_app, new_name(), module_args={"hidden": 8}, stop={"target_epochs": 3})
    assert created["join_token"].startswith("ssj_")
    assert created["state"] == "pending" and created["swarm_id"].startswith(created["name"] + "-")
    with api_app.admin() as http:  # the full view: spec args are for the admin token only
        fetched = http.get(api.run(created["name"])).json()
    assert "join_token" not in fetched and created["join_token"] not in str(fetched)
    assert fetched["spec"]["module_args"] == {"hidden": 8}
    assert fetched["spec"]["stop"]["target_epochs"] == 3
    assert fetched["workers"] == {"desired": 1, "min": 0, "max": 4, "live": 0, "running": 0, "launching": 0}


@pytest.mark.timeout(60)
def test_a_trainer_section_is_kept_and_its_plugin_arguments_are_for_the_admin_only(
    api_app: Orchestrator,
) -> None:
    trainer = {
        "precision": "bf16-mixed",
        "gradient_clip_val": 0.5,
        "val_check_interval": 20,
        "check_val_every_n_epoch": None,
        "callbacks": [LR_MONITOR],
        "loggers": [{"path": "lightning.pytorch.loggers:CSVLogger", "args": {"save_dir": "/srv/private"}}],
    }
    name = create(api_app, new_name(), trainer=trainer, report_metrics=["train_loss", "val_*", "lr-*"])[
        "name"
    ]
    with api_app.admin() as http:
        full = http.get(api.run(name)).json()["spec"]
    with api_app.client() as http:
        public = http.get(api.run(name)).json()["spec"]
    assert full["report_metrics"] == public["report_metrics"] == ["train_loss", "val_*", "lr-*"]
    assert full["trainer"]["precision"] == "bf16-mixed" and full["trainer"]["check_val_every_n_epoch"] is None
    assert full["trainer"]["callbacks"] == [{"path": LR_MONITOR, "args": {}}]
    assert full["trainer"]["loggers"][0]["args"] == {"save_dir": "/srv/private"}
    assert public["trainer"]["loggers"] == [{"path": "lightning.pytorch.loggers:CSVLogger", "args": {}}]
    assert public["trainer"]["val_check_interval"] == 20


@pytest.mark.timeout(60)
def test_a_new_run_is_stored_with_its_sync_mode_diloco_unless_the_spec_names_one(
    api_app: Orchestrator,
) -> None:
    plain = create(api_app, new_name())
    named = create(api_app, new_name(), strategy_options={"sync": "gradients"})
    diloco = create(api_app, new_name(), strategy_options={"sync": "diloco", "sync_every_s": 5.0})
    assert (plain["sync"], named["sync"], diloco["sync"]) == ("diloco", "gradients", "diloco")
    with api_app.admin() as http:  # written into the run, so a later change of the default never changes it
        stored = http.get(api.run(plain["name"])).json()["spec"]["strategy_options"]
    assert stored == {"sync": "diloco"}
    with api_app.client() as http:  # the public view says it too: a mode is no secret
        listed = {r["name"]: r["sync"] for r in http.get(api.runs()).json()["items"]}
    assert (listed[plain["name"]], listed[named["name"]]) == ("diloco", "gradients")

    # a run stored before runs named their mode trains, and reads, as it always did
    engine = create_engine(api_app.database_url())
    try:
        with Session(engine) as session:
            row = session.scalars(select(Run).where(Run.name == plain["name"])).one()
            row.strategy_options = {}
            session.commit()
    finally:
        engine.dispose()
    with api_app.client() as http:
        assert http.get(api.run(plain["name"])).json()["sync"] == "gradients"


@pytest.mark.timeout(60)
def test_duplicate_name_is_409(api_app: Orchestrator) -> None:
    name = new_name()
    create(api_app, name)
    with api_app.admin() as http:
        response = http.post(api.runs(), json=run_spec(name))
    assert response.status_code == 409 and "exists" in response.json()["detail"]


@pytest.mark.timeout(60)
def test_list_filters_by_state_and_paginates(api_app: Orchestrator) -> None:
    names = [create(api_app, new_name("page"))["name"] for _ in range(3)]
    with api_app.admin() as http:
        assert http.post(api.run_stop(names[0])).json()["state"] == "stopped"
        first = http.get(api.runs(), params={"limit": 2, "offset": 0}).json()
        second = http.get(api.runs(), params={"limit": 2, "offset": 2}).json()
        stopped = http.get(api.runs(), params={"state": "stopped", "limit": 1000}).json()
    assert first["total"] == second["total"] >= 3 and len(first["items"]) == 2
    assert not {r["name"] for r in first["items"]} & {r["name"] for r in second["items"]}
    assert [r["name"] for r in first["items"]][:2] == [names[2], names[1]]  # newest first
    assert names[0] in {r["name"] for r in stopped["items"]}
    assert all(r["state"] == "stopped" for r in stopped["items"]) and stopped["total"] == len(
        stopped["items"]
    )


@pytest.mark.timeout(60)
def test_scale_keeps_desired_within_bounds(api_app: Orchestrator) -> None:
    name = create(api_app, new_name())["name"]
    with api_app.admin() as http:
        assert http.post(api.run_scale(name), json={"desired_workers": 3}).json()["workers"]["desired"] == 3
        too_many = http.post(api.run_scale(name), json={"desired_workers": 5})
        bounds = http.post(api.run_scale(name), json={"desired_workers": 6, "max_workers": 6}).json()
        inverted = http.post(api.run_scale(name), json={"desired_workers": 2, "min_workers": 3})
        http.post(api.run_stop(name))
        after_stop = http.post(api.run_scale(name), json={"desired_workers": 1})
    assert too_many.status_code == 422 and "[0, 4]" in too_many.json()["detail"]
    assert bounds["workers"]["desired"] == 6 and bounds["workers"]["max"] == 6
    assert inverted.status_code == 422
    assert after_stop.status_code == 409


@pytest.mark.timeout(60)
def test_stop_resume_delete_follow_the_lifecycle(api_app: Orchestrator) -> None:
    name = create(api_app, new_name())["name"]
    with api_app.admin() as http:
        assert http.delete(api.run(name)).status_code == 409  # pending: stop first
        assert http.post(api.run_resume(name)).status_code == 409
        stopped = http.post(api.run_stop(name), json={"reason": "enough"}).json()
        assert stopped["state"] == "stopped" and stopped["finished_at"]
        assert http.post(api.run_stop(name)).json()["state"] == "stopped"  # idempotent
        assert http.post(api.run_resume(name)).json()["state"] == "pending"
        http.post(api.run_stop(name))
        assert http.delete(api.run(name)).status_code == 204
        assert http.get(api.run(name)).status_code == 404
        assert http.delete(api.run(name)).status_code == 404


@pytest.mark.timeout(60)
def test_events_page_with_a_cursor(api_app: Orchestrator) -> None:
    name = create(api_app, new_name())["name"]
    with api_app.admin() as http:
        http.post(api.run_scale(name), json={"desired_workers": 2})
        http.post(api.run_stop(name))
        first = http.get(api.run_events(name), params={"limit": 2}).json()
        rest = http.get(api.run_events(name), params={"after_id": first["next_after_id"]}).json()
        empty = http.get(api.run_events(name), params={"after_id": rest["next_after_id"]}).json()
    kinds = [e["kind"] for e in first["items"] + rest["items"]]
    assert kinds[:2] == ["run.created", "run.scaled"] and "run.state" in kinds[2:]
    assert len(first["items"]) == 2 and all(e["id"] > first["next_after_id"] for e in rest["items"])
    assert empty == {"items": [], "next_after_id": rest["next_after_id"]}


LR_MONITOR = "lightning.pytorch.callbacks:LearningRateMonitor"
MODEL_CHECKPOINT = "lightning.pytorch.callbacks:ModelCheckpoint"
EARLY_STOPPING = "lightning.pytorch.callbacks:EarlyStopping"

# (method, path, json body or raw bytes, expected status, text expected in the detail)
INVALID: list[tuple[str, str, Any, int, str]] = [
    ("POST", api.runs(), {**run_spec("bad-1"), "surprise": 1}, 422, "surprise"),
    ("POST", api.runs(), {**run_spec("bad-2"), "batch_size": "eight"}, 422, "batch_size"),
    ("POST", api.runs(), {**run_spec("bad-3"), "desired_workers": -1}, 422, "desired_workers"),
    ("POST", api.runs(), {**run_spec("bad-4"), "min_workers": 3, "max_workers": 2}, 422, "min_workers"),
    ("POST", api.runs(), {**run_spec("bad-5"), "module": "no.such.module:Thing"}, 422, "cannot import"),
    (
        "POST",
        api.runs(),
        {**run_spec("bad-6"), "module": "tests.support.models:Missing"},
        422,
        "no attribute",
    ),
    (
        "POST",
        api.runs(),
        {**run_spec("bad-7"), "module": "tests.support.models:NotAModule"},
        422,
        "not a LightningModule",
    ),
    (
        "POST",
        api.runs(),
        {**run_spec("bad-8"), "datamodule": "tests.support.models:TinyModule"},
        422,
        "LightningDataModule",
    ),
    ("POST", api.runs(), {**run_spec("bad-9"), "name": "Bad Name"}, 422, "name"),
    ("POST", api.runs(), {**run_spec("bad-10"), "stop": {"target_epochs": 0}}, 422, "target_epochs"),
    ("POST", api.runs(), b"{not json", 422, ""),
    ("POST", api.runs(), [1, 2], 422, ""),
    ("POST", api.runs(), {**run_spec("bad-11"), "module_args": {"x": "y" * 70_000}}, 413, "limit"),
    *[
        ("POST", api.runs(), {**run_spec(f"trainer-{i}"), **change}, 422, detail)
        for i, (change, detail) in enumerate(
            [
                ({"trainer": {"precision": "16-true"}}, "'bf16-mixed'"),
                ({"trainer": {"precison": "bf16-mixed"}}, "'precison' is not a trainer option (did you mean"),
                ({"trainer": {"accumulate_grad_batches": 4}}, "raise target_batch_size"),
                ({"trainer": {"max_epochs": 4}}, "stop condition"),
                ({"trainer": {"callbacks": ["no.such.module:Callback"]}}, "callbacks[0]: cannot import"),
                ({"trainer": {"callbacks": [MODEL_CHECKPOINT]}}, "orchestrator keeps the run's checkpoints"),
                ({"trainer": {"callbacks": [LR_MONITOR, EARLY_STOPPING]}}, f"[1]: {EARLY_STOPPING}: Early"),
                ({"trainer": {"callbacks": [{"path": LR_MONITOR, "args": {"interval": 1}}]}}, "'interval'"),
                ({"trainer": {"loggers": [LR_MONITOR]}}, "trainer.loggers[0]"),
                ({"strategy_options": {"precision": "bf16-mixed"}}, "set it in the trainer section"),
                ({"strategy_options": {"matchmaking_tme": 1.0}}, "did you mean 'matchmaking_time'"),
                ({"strategy_options": {"use_rellay": True}}, "did you mean 'use_relay'"),
                ({"strategy_options": {"target_batch_size": 64}}, "run spec's target_batch_size"),
                (
                    {"strategy_options": {"sync": "diloco", "sync_every_s": 0}},
                    "sync_every_s must be a positive",
                ),
                (
                    {"strategy_options": {"matchmaking_time": 5, "averaging_timeout": 2}},
                    "must be longer than",
                ),
                ({"report_metrics": [f"m{n}" for n in range(17)]}, "report_metrics"),
                ({"module_args": {"hidden": "sixteen"}}, "module_args.hidden: expected int, got 'sixteen'"),
                (
                    {"strategy_options": {"matchmaking_time": "fast"}},
                    "strategy_options: matchmaking_time: expected float, got 'fast'",
                ),
                ({"datamodule_args": {"size": 8.5}}, "datamodule_args.size: expected int, got 8.5"),
                (  # what only "gradients" mode does, asked of a spec that names no mode: it must name one
                    {"stop": {"target_samples": 4096}},
                    "stop.target_samples needs a sync mode: new runs train with sync='diloco'",
                ),
                (
                    {"strategy_options": {"use_local_updates": True}},
                    "strategy_options.use_local_updates needs a sync mode",
                ),
                (
                    {"strategy_options": {"sync": "gradients", "delay_optimizer_step": True}},
                    (
                        "strategy_options: a delayed optimizer step (delay_optimizer_step or "
                        "delay_grad_averaging) needs delay_state_averaging=True"
                    ),
                ),
                (
                    {"trainer": {"loggers": ["lightning.pytorch.loggers:WandbLogger"]}},
                    (
                        "trainer.loggers[0]: lightning.pytorch.loggers:WandbLogger: it needs wandb>=0.12.10, "
                        "which the run does not install: add it to the run's requirements (spotswarm runs "
                        "create --requirement 'wandb>=0.12.10'"
                    ),
                ),
            ]
        )
    ],
    ("GET", "/api/v1/runs?limit=0", None, 422, "limit"),
    ("GET", "/api/v1/runs?limit=abc", None, 422, "limit"),
    ("GET", "/api/v1/runs?state=sleeping", None, 422, "state"),
    ("GET", "/api/v1/runs?offset=-1", None, 422, "offset"),
    ("GET", api.run("nope"), None, 404, "not found"),
    ("POST", api.run_scale("nope"), {"desired_workers": 1}, 404, "not found"),
    ("POST", api.run_stop("nope"), None, 404, "not found"),
    ("GET", "/api/v1/runs/nope/progress?max_points=0", None, 422, "max_points"),
    ("POST", api.register(), {"hostname": "x"}, 401, "token"),
    ("POST", api.heartbeat("abc"), {}, 422, "worker_id"),
    # the caller is checked before the body: an unknown worker is 404 whatever the body
    ("POST", api.heartbeat("999999"), {"samples": -1}, 404, "not found"),
    ("GET", api.run_latest_checkpoint("nope"), None, 404, "not found"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("method", "path", "body", "status", "detail"), INVALID, ids=[f"{m} {p}" for m, p, *_ in INVALID]
)
def test_bad_input_gets_a_4xx_with_a_message(
    api_app: Orchestrator, method: str, path: str, body: Any, status: int, detail: str
) -> None:
    with api_app.admin() as http:
        if isinstance(body, bytes):
            response = http.request(method, path, content=body, headers={"Content-Type": "application/json"})
        else:
            response = http.request(method, path, json=body)
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert detail.lower() in str(response.json()["detail"]).lower()


@pytest.mark.timeout(60)
def test_admin_endpoints_refuse_missing_wrong_and_non_admin_tokens(api_app: Orchestrator) -> None:
    created = create(api_app, new_name())
    name, join = created["name"], created["join_token"]
    cases = [(None, 401), ("garbage", 401), (join, 403)]
    for token, status in cases:
        with api_app.client(token) as http:
            for method, path, body in [
                ("POST", api.runs(), run_spec(new_name("x"))),
                ("POST", api.run_scale(name), {"desired_workers": 2}),
                ("POST", api.run_stop(name), None),
                ("POST", api.run_resume(name), None),
                ("DELETE", api.run(name), None),
            ]:
                response = http.request(method, path, json=body)
                assert response.status_code == status, (token, method, path, response.text)
                assert "join_token" not in response.text and "swarm_id" not in response.text
    with api_app.client() as http:
        assert http.get(api.run(name)).json()["workers"]["desired"] == 1  # nothing changed


EXPECTED_DB_FAILURE = {
    "sqlite": (503, "database unavailable, retry later"),
    "postgres": (500, "internal database error"),
}


@pytest.mark.timeout(60)
def test_a_database_failure_is_a_clean_json_error(api_app: Orchestrator, backend: str) -> None:
    name = create(api_app, new_name())["name"]
    url = api_app.db_url or f"sqlite:///{api_app.data_dir / 'spotswarm.db'}"
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE events RENAME TO events_hidden"))
        with api_app.client() as http:
            response = http.get(api.run_events(name))
        # PostgreSQL reports a missing table as a programming error (500), SQLite as operational (503).
        answer = (response.status_code, response.json()["detail"])
        assert answer == EXPECTED_DB_FAILURE[backend], response.text
        assert "Traceback" not in response.text and "events" not in response.text
    finally:
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE events_hidden RENAME TO events"))
        engine.dispose()
    with api_app.client() as http:
        assert http.get(api.run_events(name)).status_code == 200


@pytest.mark.timeout(60)
def test_a_run_stored_before_the_create_time_rules_still_reads(api_app: Orchestrator) -> None:
    """strategy_options holding a Trainer option are refused at create time, not by the spec model: a run
    stored before that rule must not make every read of runs fail."""
    name = create(api_app, new_name())["name"]
    url = api_app.db_url or f"sqlite:///{api_app.data_dir / 'spotswarm.db'}"
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            legacy = json.dumps({"precision": "bf16-mixed"})
            conn.execute(
                text("UPDATE runs SET strategy_options = :o WHERE name = :n"), {"o": legacy, "n": name}
            )
    finally:
        engine.dispose()
    with api_app.admin() as http:
        assert http.get(api.run(name)).json()["spec"]["strategy_options"] == {"precision": "bf16-mixed"}
        assert http.get(api.runs(), params={"limit": 1000}).status_code == 200
        assert http.post(api.run_stop(name)).status_code == 200
