"""``/api/v1/runs/{name}/workers/{worker_id}/log``: the tail of a local worker's log, bounded, read
forward from an offset, for the admin token only (its CLI, ``runs logs``, against a real server:
tests/integration/test_operability.py). The app in-process."""

from __future__ import annotations

import pytest

from tests.support import api
from tests.support.inprocess import InProcessOrchestrator as Orchestrator
from tests.support.operability import (
    OPERABILITY_ENV,
    admin_get,
    create,
    join,
    launch_intent,
    local_worker_with_log,
)

ORCHESTRATOR_ENV = OPERABILITY_ENV


@pytest.mark.timeout(120)
def test_worker_log_tail_is_bounded_and_follows_the_read_rule(api_app: Orchestrator) -> None:
    name, join_token = create(api_app)
    worker, log = local_worker_with_log(
        api_app, name, "".join(f"line {i:05d} of the worker's log\n" for i in range(5000))
    )
    path = api.run_worker_log(name, worker.worker_id)

    tail = admin_get(api_app, path, tail_bytes=100)
    assert tail["size_bytes"] == log.stat().st_size and tail["truncated"]
    assert len(tail["text"].encode()) <= 100 and tail["text"].startswith("line ")
    assert tail["text"].endswith("line 04999 of the worker's log\n")
    assert tail["offset"] + len(tail["text"].encode()) == tail["size_bytes"]
    whole = admin_get(api_app, path, tail_bytes=1024 * 1024)
    assert not whole["truncated"] and whole["text"] == log.read_text()

    with api_app.admin() as http:
        assert http.get(path, params={"tail_bytes": 1024 * 1024 + 1}).status_code == 422
        assert http.get(path, params={"tail_bytes": 0}).status_code == 422
        assert http.get(api.run_worker_log(name, "999999")).status_code == 404
        other_name, _ = create(api_app)
        assert http.get(path.replace(name, other_name)).status_code == 404  # not that run's worker
        manual = join(api_app, join_token)
        refused = http.get(api.run_worker_log(name, manual.worker_id))
        assert refused.status_code == 409 and "by hand" in refused.json()["detail"]
        other_request, other_launch = launch_intent(api_app, other_name)
        silent = join(api_app, other_launch, other_request)
        missing = http.get(api.run_worker_log(other_name, silent.worker_id))
        assert missing.status_code == 404 and "no log" in missing.json()["detail"]
    with api_app.client() as anonymous:
        assert anonymous.get(path).status_code == 401
    with api_app.client(join_token) as http:
        assert http.get(path).status_code == 403
