"""What a caller without the admin token can see and do: the app in-process in its default configuration
(public reads on), and with private reads.

- anonymous reads leave out the free-form values of runs and workers (spec args and options, launch
  details that locate a machine) and worker logs; the admin token gets them;
- every authenticated route answers 401 to a call without a token before it looks at the body;
- host names, launcher handles, messages and reasons with control characters are refused (422), so
  they cannot forge lines in the server's log;
- a run's ``secret_env`` values in what a worker sends (a failure message quoting a credential) are
  masked before anything is stored or logged, whatever the worker did itself;
- with private reads, every read needs the admin token (a run's peers also a token of the run).

What `spotswarm serve` itself writes (its output, its data dir) is checked on a real server:
tests/integration/test_serve_exposure.py.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest

from orchestrator.db.models import Worker
from orchestrator.db.session import Database
from orchestrator.domain import workers
from tests.support import api
from tests.support.inprocess import InProcessOrchestrator as Orchestrator
from tests.support.inprocess import inprocess_orchestrator
from tests.support.orchestrator import NO_RECONCILE
from tests.support.specs import run_spec

FREE_FORM = {
    "module_args": {"api_key": "sk-not-for-anonymous-eyes"},
    "datamodule_args": {"bucket": "s3://private-bucket/data"},
    "strategy_options": {"matchmaking_time": 2.0, "sync": "diloco"},  # named: else the run names its mode
    # launcher_options are left out the same way; the local launcher refuses any at create time
    "env": {"DATA_URL": "s3://private-bucket/raw"},
}


@pytest.fixture
def worker(api_app: Orchestrator) -> dict[str, Any]:
    """A run with free-form values and one worker joined by hand (id, token, run name, join token)."""
    with api_app.admin() as http:
        created = http.post(api.runs(), json=run_spec("exposed", **FREE_FORM))
        assert created.status_code == 201, created.text
    join = created.json()["join_token"]
    with api_app.client(join) as http:
        registered = http.post(api.register(), json={"hostname": "box-1"})
        assert registered.status_code == 200, registered.text
    return {**registered.json(), "run": "exposed", "join_token": join}


# -- anonymous reads -----------------------------------------------------------------------------------


def test_anonymous_reads_leave_out_free_form_values_the_admin_gets_them(
    api_app: Orchestrator, worker: dict[str, Any]
) -> None:
    with api_app.client() as anonymous, api_app.admin() as admin:
        for path in (api.run("exposed"), api.runs()):
            public = anonymous.get(path).json()
            public_run = public if "spec" in public else public["items"][0]
            assert public_run["redacted"] is True
            assert all(public_run["spec"][key] == {} for key in FREE_FORM), public_run["spec"]
            assert "sk-not-for" not in anonymous.get(path).text
            full = admin.get(path).json()
            full_run = full if "spec" in full else full["items"][0]
            assert full_run["redacted"] is False
            assert {key: full_run["spec"][key] for key in FREE_FORM} == FREE_FORM
        log = api.run_worker_log("exposed", worker["worker_id"])
        refused = anonymous.get(log)
        assert refused.status_code == 401, refused.text
        assert admin.get(log).status_code == 409  # allowed; a worker joined by hand keeps its log itself


def test_anonymous_worker_views_keep_what_describes_a_machine_not_where_it_is(
    api_app: Orchestrator, worker: dict[str, Any]
) -> None:
    details = {
        "instance_type": "g5.xlarge",
        "availability_zone": "us-east-1a",
        "market": "spot",
        "price_usd_per_hour": 0.42,
        "private_ip": "10.0.3.7",
        "public_ip": "54.1.2.3",
        "subnet_id": "subnet-0abc",
        "log_path": "/srv/spotswarm/workers/req.log",
    }
    db = Database(f"sqlite:///{(api_app.data_dir / 'spotswarm.db').resolve()}")
    try:  # what a launcher reports about its instance, written as the reconciler writes it
        with db.begin() as session:
            row = session.get(Worker, int(worker["worker_id"]))
            assert row is not None
            workers.set_launch_details(row, "i-0123456789", details)
    finally:
        db.close()
    path = api.run_workers(worker["run"])
    with api_app.client() as anonymous, api_app.admin() as admin:
        public = anonymous.get(path).json()["items"][0]
        full = admin.get(path).json()["items"][0]
    assert public["redacted"] is True and full["redacted"] is False
    assert public["launch_details"] == {
        "instance_type": "g5.xlarge",
        "availability_zone": "us-east-1a",
        "market": "spot",
        "price_usd_per_hour": 0.42,
    }
    assert full["launch_details"] == details


# -- the token before the body -------------------------------------------------------------------------

PUBLIC_GETS = re.compile(r"^/(healthz|readyz|metrics|api/v1/(swarm-auth|peers|runs(/\{name\}(/[a-z]+)?)?))$")


def _authenticated_operations(api_app: Orchestrator) -> list[tuple[str, str, bool]]:
    """(method, path template, has a body) of every operation that needs a token, from the schema."""
    with api_app.client() as http:
        schema = http.get("/openapi.json").json()
    found = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            if method == "get" and PUBLIC_GETS.match(path):
                continue
            found.append((method.upper(), path, "requestBody" in operation))
    return found


def test_every_authenticated_route_checks_the_token_before_the_body(
    api_app: Orchestrator, worker: dict[str, Any]
) -> None:
    operations = _authenticated_operations(api_app)
    assert len(operations) >= 12, operations  # the schema lists them all (not a silently empty loop)
    values = {"name": worker["run"], "worker_id": worker["worker_id"], "epoch": "1", "sha256": "0" * 64}
    wrong = {}
    for token in (None, "garbage"):
        with api_app.client(token) as http:
            for method, template, has_body in operations:
                path = template.format(**values)
                body = {"content": b'{"bogus": [1, 2]}', "headers": {"Content-Type": "application/json"}}
                response = http.request(method, path, **(body if has_body else {}))
                # a token that is not this worker's own is refused by the worker's check: 403
                expected = 403 if token and template.startswith("/api/v1/workers/{worker_id}") else 401
                if response.status_code != expected:
                    wrong[f"{token} {method} {template}"] = (response.status_code, response.text[:200])
    assert not wrong, wrong


# -- control characters ---------------------------------------------------------------------------------

FORGED = (
    "\n2026-11-23 14:40:00,000 WARNING [run=exposed worker=-] orchestrator.domain.runs: run.deleted FORGED"
)


CONTROLLED = [FORGED, "gpu-1\rFORGED", "red\x1b[31mFORGED", "tab\tFORGED", "ls\u2028FORGED"]


@pytest.mark.parametrize("bad", CONTROLLED)
def test_control_characters_are_refused_where_they_would_reach_the_log(
    api_app: Orchestrator, worker: dict[str, Any], bad: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every record the server writes, whatever its level
    with api_app.client(worker["join_token"]) as http:
        for body in ({"hostname": bad}, {"hostname": "ok", "launcher_handle": bad}):
            refused = http.post(api.register(), json=body)
            assert refused.status_code == 422 and "control character" in refused.text, refused.text
    with api_app.client(worker["worker_token"]) as http:
        path = api.deregister(worker["worker_id"])
        refused = http.post(path, json={"reason": "error", "message": bad})
        assert refused.status_code == 422 and "control character" in refused.text, refused.text
    with api_app.admin() as http:
        refused = http.post(api.run_stop("exposed"), json={"reason": bad})
        assert refused.status_code == 422 and "control character" in refused.text, refused.text
        assert http.get(api.run("exposed")).json()["state"] != "stopping"
    with api_app.client(worker["join_token"]) as http:  # what is accepted is logged, and seen here
        joined = http.post(api.register(), json={"hostname": "honest-box"})
    assert joined.status_code == 200, joined.text
    assert "honest-box" in caplog.text  # the capture holds the server's lines
    assert "FORGED" not in caplog.text


# -- secret values in what a worker sends ------------------------------------------------------------------

SECRET = "sk-LEAKME-abcdef123456"


def test_secret_values_a_worker_sends_are_masked_before_they_are_stored_or_logged(
    api_app: Orchestrator, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker that does not redact (older, hand-written) sends the first line of a user's exception,
    which quotes the run's secret: no view, event or log line of the server holds it."""
    caplog.set_level(logging.DEBUG)
    spec = run_spec("secretive", secret_env={"API_KEY": SECRET})
    with api_app.admin() as http:
        created = http.post(api.runs(), json=spec)
        assert created.status_code == 201, created.text
    with api_app.client(created.json()["join_token"]) as http:
        registered = http.post(api.register(), json={"hostname": f"box-{SECRET}"})
        assert registered.status_code == 200, registered.text
    worker = registered.json()
    assert worker["secret_env"] == {"API_KEY": SECRET}  # the worker itself gets it
    leak = f"training failed: HTTPError: 401 for url: https://api.example/whoami?token={SECRET}"
    with api_app.client(worker["worker_token"]) as http:
        left = http.post(api.deregister(worker["worker_id"]), json={"reason": "error", "message": leak})
        assert left.status_code == 204, left.text
    paths = [api.run("secretive"), api.run_workers("secretive"), api.run_events("secretive")]
    with api_app.client() as anonymous, api_app.admin() as admin:
        seen = {
            f"{who} {path}": http.get(path).text
            for path in paths
            for who, http in (("anonymous", anonymous), ("admin", admin))
        }
    events = seen["anonymous /api/v1/runs/secretive/events"]
    assert "whoami?token=***" in events, events  # the message is kept, the secret masked
    assert [where for where, text in seen.items() if SECRET in text] == []
    assert "whoami?token=***" in caplog.text
    assert SECRET not in caplog.text


# -- private reads -----------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_private_reads_need_the_admin_token(tmp_path: Path) -> None:
    env = {**NO_RECONCILE, "SPOTSWARM_PUBLIC_READS": "false", "SPOTSWARM_CHECK_IMPORTS": "false"}
    with inprocess_orchestrator(tmp_path / "data", env=env) as api_app:
        _private_reads(api_app)


def _private_reads(api_app: Orchestrator) -> None:
    with api_app.admin() as http:
        created = http.post(api.runs(), json=run_spec("private")).json()
    for path in [api.runs(), api.run("private"), api.run_events("private"), api.peers()]:
        with api_app.client() as http:
            assert http.get(path).status_code == 401
        with api_app.client(created["join_token"]) as http:
            assert http.get(path).status_code == 403
        with api_app.admin() as http:
            assert http.get(path).status_code == 200
    with api_app.client(created["join_token"]) as http:  # a run's peers also take its join token
        assert http.get(api.run_peers("private")).status_code == 200
    with api_app.client() as http:
        assert http.get(api.run_peers("private")).status_code == 401
