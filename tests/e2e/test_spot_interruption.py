"""A spot interruption end to end: a real worker agent training the digits example gets a short spot
notice (40 s: too short to train on, so it leaves at once) from a fake instance metadata service,
saves and uploads a final checkpoint (it is the run's checkpointer), deregisters as ``interrupted``, and
the orchestrator's reconcile loop replaces it at once, without waiting for a heartbeat timeout; the
replacement resumes from that checkpoint and
the run goes on. Checkpoints are kept in S3 (a moto server), as on AWS.

The worker is local (``local`` launcher) and finds the metadata service through
``SPOTSWARM_METADATA_URL``, which local workers inherit from the orchestrator's environment, just as
the ``ec2`` launcher writes it into an instance's user data.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support import api
from tests.support.aws import FakeAws
from tests.support.imds import FakeImds, serving_imds
from tests.support.processes import ProcessRegistry
from tests.support.runs import RunReader, admin_post, digits_run, start_loop_orchestrator
from tests.support.waiting import wait_until

HEARTBEAT_TIMEOUT_S = 30.0  # the replacement must come long before the loop could call the worker lost


@pytest.fixture
def metadata() -> Iterator[FakeImds]:
    with serving_imds() as server:
        yield server


def event_time(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(event["at"])


@pytest.mark.swarm
@pytest.mark.timeout(300)
def test_spot_notice_checkpoints_leaves_interrupted_and_is_replaced_at_once(
    processes: ProcessRegistry, loop_data_dir: Path, metadata: FakeImds, aws: FakeAws
) -> None:
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="spotswarm-checkpoints")
    env = {
        "SPOTSWARM_METADATA_URL": metadata.url,  # inherited by the local workers
        "SPOTSWARM_HEARTBEAT_TIMEOUT_S": str(HEARTBEAT_TIMEOUT_S),
        "SPOTSWARM_CHECK_IMPORTS": "false",  # the digits example imports; the probe costs ~20 s here
        "SPOTSWARM_S3_BUCKET": "spotswarm-checkpoints",
        "SPOTSWARM_S3_PREFIX": "team-a",
        "SPOTSWARM_S3_REGION": aws.region,
        "SPOTSWARM_S3_ENDPOINT_URL": aws.endpoint_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_CONFIG_FILE": str(loop_data_dir.parent / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(loop_data_dir.parent / "no-aws-config"),
    }
    orch = start_loop_orchestrator(processes, loop_data_dir, extra_env=env)
    # One worker, so it is the checkpointer; no periodic checkpoints, so the only one is the final one.
    spec = digits_run(
        "spot-digits", desired_workers=1, checkpoint_every_epochs=10_000, stop={"target_epochs": 100_000}
    )
    admin_post(orch, api.runs(), spec)
    reader = RunReader(orch, "spot-digits")

    def training() -> list[dict[str, Any]]:
        return [w for w in reader.running() if w["swarm_epoch"] >= 2 and w["checkpointer"]]

    [first] = wait_until(training, 180, interval_s=1, message="the first worker trains (swarm epoch 2)")
    assert reader.checkpoints() == []

    # Too short to train on (agent.SPOT_LEAVE_BUDGET_S + SPOT_NOTICE_MARGIN_S): the worker leaves at
    # once. With EC2's two minutes it trains on while its replacement starts (test_spot_prelaunch.py).
    metadata.interrupt(seconds_ahead=40)

    assert metadata.delivered.wait(30), "the worker's spot watcher polls the metadata service"

    def left() -> dict[str, Any]:
        row = next(w for w in reader.workers() if w["id"] == first["id"])
        return row if row["state"] != "running" else {}

    gone = wait_until(left, 60, message="the noticed worker leaves")
    assert gone["state"] == "interrupted"
    assert gone["exit_reason"].startswith("interrupted: spot interruption notice: terminate at")

    # Its final checkpoint was stored before it left, and was the run's first.
    history = reader.events()
    [stored] = [e for e in history if e["kind"] == "checkpoint.stored"]
    assert stored["worker_id"] == first["id"]
    [checkpoint] = reader.checkpoints()
    assert checkpoint["epoch"] >= 2
    [stored_object] = s3.list_objects_v2(Bucket="spotswarm-checkpoints", Prefix="team-a/")["Contents"]
    head = s3.head_object(Bucket="spotswarm-checkpoints", Key=stored_object["Key"])
    assert head["Metadata"]["sha256"] == checkpoint["sha256"]
    assert stored_object["Size"] == checkpoint["size_bytes"]

    # The replacement was launched at once: within a few reconcile ticks of the deregistration.
    [interrupted] = [
        e
        for e in history
        if e["worker_id"] == first["id"] and e["kind"] == "worker.state" and "-> interrupted" in e["message"]
    ]

    def replacement_launch() -> dict[str, Any]:
        launches = [
            e for e in reader.events() if e["kind"] == "worker.launching" and e["worker_id"] != first["id"]
        ]
        return launches[0] if launches else {}

    launch = wait_until(replacement_launch, 30, message="a replacement is launched")
    assert launch["id"] > interrupted["id"]
    # (A tick's events carry the time the tick began, which may precede the deregistration slightly.)
    delay_s = (event_time(launch) - event_time(interrupted)).total_seconds()
    assert delay_s < HEARTBEAT_TIMEOUT_S / 3, f"replacement after {delay_s:.1f} s"
    assert not [e for e in reader.events() if "-> lost" in e["message"]], "nobody was lost"

    # The replacement resumes from that checkpoint and the run goes on past it.
    def resumed() -> dict[str, Any]:
        rows = [w for w in reader.running() if w["id"] == launch["worker_id"]]
        return rows[0] if rows and rows[0]["swarm_epoch"] > checkpoint["epoch"] else {}

    second = wait_until(resumed, 180, interval_s=1, message="the replacement trains past the checkpoint")
    assert "resuming from the run's checkpoint" in reader.worker_log(second["id"])
    assert reader.run()["state"] == "running"
