"""A run whose code fails quoting one of its ``secret_env`` values (as an HTTP client's error quotes the
URL it called): the real reconcile loop launches a local worker, which fails; nothing anyone can read
afterwards holds the value (the public views, the events, the worker's log, the server's log)."""

from __future__ import annotations

import pytest

from tests.support import api
from tests.support.orchestrator import Orchestrator
from tests.support.runs import RunReader, admin_post
from tests.support.specs import run_spec
from tests.support.waiting import BOOT_S, wait_until

SECRET = "sk-LEAKME-abcdef123456"


@pytest.mark.timeout(300)
def test_a_launched_workers_failure_quoting_a_secret_is_masked_everywhere(loop_orch: Orchestrator) -> None:
    spec = run_spec(
        "secret-failure",
        module="tests.support.models:CredentialQuotingModule",
        secret_env={"API_KEY": SECRET},
        min_workers=1,
        max_workers=1,
    )
    admin_post(loop_orch, api.runs(), spec)
    reader = RunReader(loop_orch, "secret-failure")
    failed = wait_until(
        lambda: [w for w in reader.workers() if w["state"] == "failed" and w["exit_reason"]],
        BOOT_S,
        message="the launched worker fails",
    )[0]
    # an unusable spec (exit 3) fails the run at once, with the worker's words as its reason: masked too
    run = wait_until(lambda: (r := reader.run())["state"] == "failed" and r, 30, message="the run fails")
    assert "whoami?token=***" in run["state_reason"], run["state_reason"]
    worker_log = reader.worker_log(failed["id"])
    assert "cannot build tests.support.models:CredentialQuotingModule" in worker_log, worker_log[-2000:]
    assert "whoami?token=***" in failed["exit_reason"], failed
    with loop_orch.client() as anonymous:
        seen = {
            path: anonymous.get(f"/api/v1/runs/secret-failure{path}").text
            for path in ("", "/workers", "/events")
        }
    seen.update({"worker log": worker_log, "server log": loop_orch.proc.log()})
    assert [where for where, text in seen.items() if SECRET in text] == []
