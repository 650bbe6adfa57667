"""Ec2Launcher against a real moto server process, instances of one peer and of one per GPU (whose
user data's start script runs here with a docker that records its calls).

moto has unlimited capacity and never answers a CreateFleet with pool errors, so :class:`SpotCapacity`
plays the part of EC2's capacity: botocore event hooks on the test's boto3 client (the cloud side of
the call, never our code) drop the overrides of exhausted pools from the request moto sees, add the
``Errors`` EC2 would return for them, and answer for EC2 when no pool is left. The launcher's own code
runs unchanged.
"""

from __future__ import annotations

import base64
import copy
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from botocore.awsrequest import AWSResponse

from orchestrator.launchers.base import Launcher, LauncherConfigError, LaunchRequest, PeerRequest
from orchestrator.launchers.ec2.gpus import GPUS_BY_INSTANCE_TYPE
from orchestrator.launchers.ec2.launcher import DEFAULT_WORKER_ENV, Ec2Launcher
from orchestrator.launchers.ec2.settings import Ec2Settings
from orchestrator.launchers.ec2.userdata import (
    DEFAULT_WORKER_TEMPLATE,
    MAX_USER_DATA_BYTES,
    machine_env,
    render_worker_user_data,
)
from tests.support.aws import WORKER_TEMPLATE, FakeAws, worker_env_of, worker_network

ORCH = "orch-test"
TEMPLATE = WORKER_TEMPLATE
TYPES = ("g5.xlarge", "g4dn.xlarge")


class SpotCapacity:
    """Pools without spare capacity, by (market, instance type, subnet); records every CreateFleet."""

    def __init__(self) -> None:
        self.exhausted: dict[tuple[str, str, str], str] = {}
        self.api_error: str | None = None  # an error code EC2 answers the whole call with
        self.requests: list[dict[str, Any]] = []

    def exhaust(
        self, market: str, instance_type: str, subnet: str, code: str = "InsufficientInstanceCapacity"
    ) -> None:
        self.exhausted[(market, instance_type, subnet)] = code

    def restore(self) -> None:
        self.exhausted.clear()

    def install(self, client: Any) -> Any:
        client.meta.events.register("before-parameter-build.ec2.CreateFleet", self._take_exhausted_pools)
        client.meta.events.register("before-call.ec2.CreateFleet", self._answer_when_nothing_left)
        client.meta.events.register("after-call.ec2.CreateFleet", self._add_pool_errors)
        return client

    def _take_exhausted_pools(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        self.requests.append(copy.deepcopy(params))
        market = params["TargetCapacitySpecification"]["DefaultTargetCapacityType"]
        errors, left = [], 0
        for config in params["LaunchTemplateConfigs"]:
            kept = []
            for override in config["Overrides"]:
                code = self.exhausted.get((market, override["InstanceType"], override.get("SubnetId", "")))
                if code:
                    errors.append({
                        "LaunchTemplateAndOverrides": {"Overrides": override},
                        "Lifecycle": market, "ErrorCode": code, "ErrorMessage": f"no {market} capacity",
                    })  # fmt: skip
                else:
                    kept.append(override)
            config["Overrides"] = kept
            left += len(kept)
        context["capacity_errors"] = errors
        context["nothing_left"] = left == 0

    def _answer_when_nothing_left(self, context: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict] | None:
        if self.api_error:
            error = {"Code": self.api_error, "Message": "simulated by SpotCapacity"}
            return AWSResponse("", 400, {}, None), {"Error": error, "ResponseMetadata": {}}
        if context.get("nothing_left"):
            parsed = {"FleetId": "fleet-00000000", "Instances": [], "Errors": context["capacity_errors"]}
            return AWSResponse("", 200, {}, None), parsed
        return None

    def _add_pool_errors(self, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        if not context.get("nothing_left"):
            parsed.setdefault("Errors", []).extend(context.get("capacity_errors", []))


class Cloud:
    """A VPC with two subnets in two zones and the worker launch template, on moto."""

    def __init__(self, fake: FakeAws) -> None:
        self.capacity = SpotCapacity()
        self.ec2 = self.capacity.install(fake.client("ec2"))
        self.subnets = worker_network(self.ec2, TYPES[0])

    def launcher(self, orchestrator_id: str = ORCH, **overrides: Any) -> Ec2Launcher:
        settings = Ec2Settings(
            orchestrator_id=orchestrator_id,
            launch_template=TEMPLATE,
            worker_image="registry.example/spotswarm-worker:1.0",
            instance_types=TYPES,
            subnet_ids=self.subnets,
            **overrides,
        )
        return Ec2Launcher(settings, client=self.ec2)

    def raw(self, instance_id: str) -> dict[str, Any]:
        return self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]

    def instances_of(self, request_id: str) -> list[dict[str, Any]]:
        filters = [{"Name": "tag:spotswarm:request-id", "Values": [request_id]}]
        pages = self.ec2.describe_instances(Filters=filters)["Reservations"]
        return [i for r in pages for i in r["Instances"]]


@pytest.fixture
def cloud(aws: FakeAws) -> Iterator[Cloud]:
    yield Cloud(aws)


def _request(request_id: str, run: str = "run-a", **options: Any) -> LaunchRequest:
    env = {"SPOTSWARM_URL": "http://10.0.0.5:8000", "SPOTSWARM_JOIN_TOKEN": f"join-{run}"}
    return LaunchRequest(request_id=request_id, run_name=run, env=env, options=options)


def _worker_env(cloud: Cloud, instance_id: str) -> dict[str, str]:
    return worker_env_of(cloud.ec2, instance_id)


@pytest.mark.timeout(60)
def test_launch_tags_instance_passes_worker_env_and_is_idempotent(cloud: Cloud) -> None:
    launcher = cloud.launcher(max_price="0.9")
    assert isinstance(launcher, Launcher)

    handle = launcher.launch(_request("req-1"))

    raw = cloud.raw(handle)
    tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
    assert tags["spotswarm:orchestrator"] == ORCH
    assert tags["spotswarm:run"] == "run-a"
    assert tags["spotswarm:request-id"] == "req-1"
    assert tags["Name"].startswith("spotswarm-run-a-")
    assert raw["InstanceLifecycle"] == "spot"
    assert raw["InstanceType"] == TYPES[0] and raw["SubnetId"] in cloud.subnets
    assert _worker_env(cloud, handle) == {
        "SPOTSWARM_URL": "http://10.0.0.5:8000",
        "SPOTSWARM_JOIN_TOKEN": "join-run-a",
        "SPOTSWARM_REQUEST_ID": "req-1",
        "SPOTSWARM_METADATA_URL": "http://169.254.169.254",
        "SPOTSWARM_HOST_MADDRS": "/ip4/0.0.0.0/tcp/31331",
    }
    fleet = cloud.capacity.requests[0]
    assert fleet["Type"] == "instant"
    assert fleet["SpotOptions"]["AllocationStrategy"] == "capacity-optimized-prioritized"
    pools = {
        (o["InstanceType"], o["SubnetId"], o["MaxPrice"])
        for o in fleet["LaunchTemplateConfigs"][0]["Overrides"]
    }
    assert pools == {(t, s, "0.9") for t in TYPES for s in cloud.subnets}

    # Same request again, from this launcher and from a fresh one (an orchestrator restart): no new machine.
    assert launcher.launch(_request("req-1")) == handle
    assert cloud.launcher().launch(_request("req-1")) == handle
    assert len(cloud.instances_of("req-1")) == 1
    assert len(cloud.capacity.requests) == 1
    assert launcher.poll_errors() == []


@pytest.mark.timeout(60)
def test_exhausted_pools_fall_back_to_next_instance_type_and_zone(cloud: Cloud) -> None:
    first, second = cloud.subnets
    for subnet in cloud.subnets:
        cloud.capacity.exhaust("spot", "g5.xlarge", subnet)
    cloud.capacity.exhaust("spot", "g4dn.xlarge", first, code="MaxSpotInstanceCountExceeded")
    launcher = cloud.launcher()

    handle = launcher.launch(_request("req-1"))

    raw = cloud.raw(handle)
    assert (raw["InstanceType"], raw["SubnetId"]) == ("g4dn.xlarge", second)
    assert raw["Placement"]["AvailabilityZone"] == "us-east-1b"
    assert launcher.poll_errors() == []


@pytest.mark.timeout(60)
def test_no_spot_capacity_is_a_retryable_failure_then_on_demand_after_n(cloud: Cloud) -> None:
    for instance_type in TYPES:
        for subnet in cloud.subnets:
            cloud.capacity.exhaust("spot", instance_type, subnet)
    launcher = cloud.launcher(on_demand_fallback_after=2)

    assert launcher.launch(_request("req-1")) == ""
    [failure] = launcher.poll_errors()
    assert (failure.request_id, failure.run_name, failure.retryable) == ("req-1", "run-a", True)
    assert failure.capacity, "a capacity failure: the reconciler waits for capacity, never fails the run"
    assert "InsufficientInstanceCapacity" in failure.reason and "g4dn.xlarge" in failure.reason
    assert launcher.poll_errors() == [], "each failure is reported once"
    assert cloud.instances_of("req-1") == []

    # Second spot failure of the run in a row: the same call goes on-demand.
    handle = launcher.launch(_request("req-2"))
    raw = cloud.raw(handle)
    assert "InstanceLifecycle" not in raw
    assert {t["Key"]: t["Value"] for t in raw["Tags"]}["spotswarm:market"] == "on-demand"
    assert launcher.poll_errors() == []
    markets = [r["TargetCapacitySpecification"]["DefaultTargetCapacityType"] for r in cloud.capacity.requests]
    assert markets == ["spot", "spot", "on-demand"]

    # Spot capacity is back: spot is tried first again and wins.
    cloud.capacity.restore()
    assert cloud.raw(launcher.launch(_request("req-3")))["InstanceLifecycle"] == "spot"


@pytest.mark.timeout(60)
def test_without_fallback_failures_repeat_and_nothing_runs_on_demand(cloud: Cloud) -> None:
    cloud.capacity.api_error = "InsufficientInstanceCapacity"
    launcher = cloud.launcher()

    for _attempt in range(3):
        assert launcher.launch(_request("req-1")) == ""
        [failure] = launcher.poll_errors()
        assert failure.retryable and "InsufficientInstanceCapacity" in failure.reason
    tokens = [r["ClientToken"] for r in cloud.capacity.requests]
    assert len(set(tokens)) == 3, "a retry needs a new client token, or EC2 repeats the first answer"
    assert {
        r["TargetCapacitySpecification"]["DefaultTargetCapacityType"] for r in cloud.capacity.requests
    } == {"spot"}

    cloud.capacity.api_error = None
    assert launcher.launch(_request("req-1")).startswith("i-")


@pytest.mark.timeout(60)
def test_requests_that_can_never_succeed_raise_config_error(cloud: Cloud) -> None:
    launcher = cloud.launcher()
    with pytest.raises(LauncherConfigError, match="unknown ec2 launcher options"):
        launcher.launch(_request("req-1", instance_typez=["g5.xlarge"]))
    with pytest.raises(LauncherConfigError, match="max_price"):
        launcher.launch(_request("req-1", max_price="cheap"))
    with pytest.raises(LauncherConfigError, match="InvalidLaunchTemplateName"):
        launcher.launch(_request("req-1", launch_template="no-such-template"))
    with pytest.raises(LauncherConfigError, match="InvalidInstanceType"):
        launcher.launch(_request("req-1", instance_types=["zz9.huge"]))
    assert launcher.poll_errors() == []
    assert cloud.instances_of("req-1") == []


@pytest.mark.timeout(60)
def test_describe_adopts_own_instances_with_price_and_never_lists_another_orchestrators(cloud: Cloud) -> None:
    launcher = cloud.launcher()
    kept = launcher.launch(_request("req-1", run="run-a"))
    second = launcher.launch(_request("req-2", run="run-b", instance_types=["g4dn.xlarge"]))
    foreign = cloud.launcher(orchestrator_id="someone-else").launch(_request("req-9"))

    restarted = cloud.launcher()  # a new orchestrator process: nothing in memory
    seen = {i.handle: i for i in restarted.describe()}
    assert set(seen) == {kept, second}
    assert seen[second].request_id == "req-2" and seen[second].run_name == "run-b" and seen[second].alive
    details = seen[second].details
    assert details["instance_type"] == "g4dn.xlarge" and details["market"] == "spot"
    assert details["availability_zone"].startswith("us-east-1")
    assert isinstance(details["price_usd_per_hour"], float)
    assert foreign not in seen, "another orchestrator's worker is never listed, so never terminated"


@pytest.mark.timeout(60)
def test_terminate_stops_only_that_request_and_a_relaunch_starts_a_new_one(cloud: Cloud) -> None:
    launcher = cloud.launcher()
    first = launcher.launch(_request("req-1"))
    second = launcher.launch(_request("req-2"))

    launcher.terminate("req-1")
    launcher.terminate("req-1")
    launcher.terminate("never-launched")

    alive = {i.handle for i in launcher.describe() if i.alive}
    assert alive == {second}
    assert cloud.raw(first)["State"]["Name"] == "terminated"

    # The reconciler relaunches a request whose instance is gone: a new machine, same request id.
    for fresh in (launcher, cloud.launcher()):
        relaunched = fresh.launch(_request("req-1"))
        assert relaunched not in (first, second)
        assert fresh.launch(_request("req-1")) == relaunched
        fresh.terminate("req-1")


@pytest.mark.timeout(60)
def test_launcher_builds_its_own_client_from_endpoint_and_region(
    cloud: Cloud,
    moto_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    settings = Ec2Settings(
        orchestrator_id=ORCH, launch_template=TEMPLATE, worker_image="w:1",
        instance_types=("g4dn.xlarge",), region="us-east-1", endpoint_url=moto_endpoint,
    )  # fmt: skip
    launcher = Ec2Launcher(settings)
    try:
        handle = launcher.launch(_request("req-1"))
        assert [i.handle for i in launcher.describe()] == [handle]
    finally:
        launcher.close()


FAKE_DOCKER = """#!/bin/sh
# docker as the worker start script calls it: records each call; "run" records the env file it was given
echo "$@" >> "$DOCKER_CALLS"
if [ "$1" = run ]; then
  while [ "$#" -gt 0 ]; do
    if [ "$1" = --env-file ]; then cat "$2" > "$2.seen"; fi
    shift
  done
fi
"""


def _multi_peer_request(peers: int, run: str = "run-a", **options: Any) -> LaunchRequest:
    request_ids = [f"req-{run}-{gpu}" for gpu in range(peers)]
    envs = [
        {"SPOTSWARM_URL": "http://10.0.0.5:8000", "SPOTSWARM_JOIN_TOKEN": f"sjl_{'x' * 43}{gpu}",
         "SPOTSWARM_REQUEST_ID": request_id}
        for gpu, request_id in enumerate(request_ids)
    ]  # fmt: skip
    siblings = tuple(PeerRequest(rid, env) for rid, env in zip(request_ids[1:], envs[1:], strict=True))
    return LaunchRequest(request_ids[0], run, envs[0], options, siblings)


def _start_script_runs(cloud: Cloud, instance_id: str, tmp_path: Path) -> list[tuple[str, dict[str, str]]]:
    """Run the instance's start script (its user data's, as systemd would) with a docker that records
    its calls: each container's ``--gpus`` and environment."""
    attr = cloud.ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    files = {f["path"]: f for f in yaml.safe_load(base64.b64decode(attr["UserData"]["Value"]))["write_files"]}
    env_dir, bin_dir = tmp_path / "etc", tmp_path / "bin"
    env_dir.mkdir(parents=True)
    bin_dir.mkdir(parents=True)
    (env_dir / "worker.env").write_bytes(base64.b64decode(files["/etc/spotswarm/worker.env"]["content"]))
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    script = tmp_path / "start"
    script.write_text(files["/usr/local/bin/spotswarm-worker-start"]["content"])
    calls = tmp_path / "calls"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SPOTSWARM_ENV_DIR": str(env_dir), "DOCKER_CALLS": str(calls)}
    subprocess.run(["sh", str(script), "registry.example/w:1", "all"], env=env, check=True, timeout=30)
    runs = []
    for line in calls.read_text().splitlines():
        if line.startswith("run "):
            args = line.split()
            gpus = next((a.removeprefix("--gpus=") for a in args if a.startswith("--gpus")), "")
            seen = Path(args[args.index("--env-file") + 1] + ".seen").read_text()
            runs.append((gpus, dict(entry.split("=", 1) for entry in seen.splitlines())))
    return sorted(runs, key=lambda run: run[0])


@pytest.mark.timeout(60)
def test_a_four_gpu_instance_runs_four_peers_each_with_its_request_id_token_port_and_gpu(
    cloud: Cloud, tmp_path: Path
) -> None:
    launcher = cloud.launcher()
    four_gpus = {"instance_types": ["g5.12xlarge"]}
    assert launcher.peers_per_machine(four_gpus) == 4, "one peer per GPU of the instance type"

    handle = launcher.launch(_multi_peer_request(4, **four_gpus))

    assert launcher.launch(_multi_peer_request(4, **four_gpus)) == handle, "idempotent by its first peer"
    [raw] = cloud.instances_of("req-run-a-0")
    assert raw["InstanceType"] == "g5.12xlarge"
    tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
    assert [tags[f"spotswarm:peer-{gpu}"] for gpu in (1, 2, 3)] == [f"req-run-a-{gpu}" for gpu in (1, 2, 3)]
    containers = _start_script_runs(cloud, handle, tmp_path)
    assert [gpus for gpus, _ in containers] == [f"device={gpu}" for gpu in range(4)]
    for gpu, (_, env) in enumerate(containers):
        assert env == {
            "SPOTSWARM_URL": "http://10.0.0.5:8000",
            "SPOTSWARM_JOIN_TOKEN": f"sjl_{'x' * 43}{gpu}",
            "SPOTSWARM_REQUEST_ID": f"req-run-a-{gpu}",
            "SPOTSWARM_METADATA_URL": "http://169.254.169.254",  # each peer polls the instance's notice
            "SPOTSWARM_HOST_MADDRS": f"/ip4/0.0.0.0/tcp/{31331 + gpu}",
        }

    # One peer alone on such an instance: one container on every GPU, exactly as before.
    lone = launcher.launch(_request("req-lone", **four_gpus, peers_per_machine=1))
    assert _start_script_runs(cloud, lone, tmp_path / "lone") == [("all", _worker_env(cloud, lone))]

    described = {i.request_id: i for i in launcher.describe()}
    assert set(described) == {"req-lone", *(f"req-run-a-{gpu}" for gpu in range(4))}
    peers = [described[f"req-run-a-{gpu}"] for gpu in range(4)]
    assert {i.handle for i in peers} == {handle} and all(i.alive for i in peers)
    assert [(i.details["machine"], i.details["peer_index"]) for i in peers] == [
        ("req-run-a-0", g) for g in range(4)
    ]
    whole = described["req-lone"].details["price_usd_per_hour"]
    assert [i.details["price_usd_per_hour"] for i in peers] == [pytest.approx(whole / 4)] * 4, (
        "a quarter each"
    )


@pytest.mark.timeout(60)
def test_eight_peers_fit_in_the_user_data_limit() -> None:
    request = _multi_peer_request(8, run="a-run-name-of-sixty-four-characters-" + "x" * 27)
    peers = [
        {**DEFAULT_WORKER_ENV, **peer.env, "SPOTSWARM_HOST_MADDRS": f"/ip4/0.0.0.0/tcp/{31331 + gpu}"}
        for gpu, peer in enumerate(request.peers)
    ]
    rendered = render_worker_user_data(
        DEFAULT_WORKER_TEMPLATE, worker_image="123456789012.dkr.ecr.eu-west-1.amazonaws.com/w:1.0",
        env=machine_env(peers), gpus=True,
    )  # fmt: skip
    assert len(rendered.encode()) < MAX_USER_DATA_BYTES / 2, len(rendered.encode())


@pytest.mark.timeout(60)
def test_an_instance_of_several_peers_ends_once_none_of_them_is_left(cloud: Cloud) -> None:
    launcher = cloud.launcher()
    handle = launcher.launch(_multi_peer_request(3, instance_types=["g5.12xlarge"], peers_per_machine=3))

    launcher.terminate("req-run-a-1")  # retired while its siblings train
    launcher.terminate("req-run-a-0")
    assert cloud.raw(handle)["State"]["Name"] == "running", "a peer still trains on it"
    assert all(i.alive for i in launcher.describe())

    cloud.launcher().terminate("req-run-a-2")  # a restarted orchestrator: it knows of no ended peer
    assert cloud.raw(handle)["State"]["Name"] == "running"
    launcher.terminate("req-run-a-2")
    assert cloud.raw(handle)["State"]["Name"] == "terminated"
    assert not any(i.alive for i in launcher.describe())


@pytest.mark.timeout(60)
def test_peers_per_machine_defaults_to_the_fewest_gpus_and_refuses_more_than_a_type_has(cloud: Cloud) -> None:
    launcher = cloud.launcher()
    assert launcher.peers_per_machine({}) == 1, "g5.xlarge and g4dn.xlarge: one GPU, one peer, as before"
    assert launcher.peers_per_machine({"instance_types": ["g5.12xlarge", "g6.12xlarge"]}) == 4
    assert launcher.peers_per_machine({"instance_types": ["p4d.24xlarge"]}) == 8
    assert launcher.peers_per_machine({"instance_types": ["g5.12xlarge", "g5.xlarge"]}) == 1
    assert launcher.peers_per_machine({"instance_types": ["g5.12xlarge"], "peers_per_machine": 2}) == 2
    assert (
        launcher.peers_per_machine({"instance_types": ["c7i.4xlarge"], "gpus": False, "peers_per_machine": 4})
        == 4
    )
    with pytest.raises(LauncherConfigError, match=r"g5.xlarge \(1 GPU\) has fewer"):
        launcher.validate_options({"instance_types": ["g5.12xlarge", "g5.xlarge"], "peers_per_machine": 4})
    for bad in (0, 9, "2", True):
        with pytest.raises(LauncherConfigError, match="peers_per_machine must be a whole number from 1 to 8"):
            launcher.validate_options({"peers_per_machine": bad})


@pytest.mark.timeout(60)
def test_the_gpu_table_agrees_with_describe_instance_types(cloud: Cloud) -> None:
    types = sorted(GPUS_BY_INSTANCE_TYPE)
    pages = cloud.ec2.get_paginator("describe_instance_types").paginate(InstanceTypes=types)
    counts = {
        t["InstanceType"]: sum(g["Count"] for g in t["GpuInfo"]["Gpus"])
        for page in pages
        for t in page["InstanceTypes"]
    }
    assert counts == GPUS_BY_INSTANCE_TYPE
