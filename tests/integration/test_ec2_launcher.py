"""Ec2Launcher against a real moto server process.

moto has unlimited capacity and never answers a CreateFleet with pool errors, so :class:`SpotCapacity`
plays the part of EC2's capacity: botocore event hooks on the test's boto3 client (the cloud side of
the call, never our code) drop the overrides of exhausted pools from the request moto sees, add the
``Errors`` EC2 would return for them, and answer for EC2 when no pool is left. The launcher's own code
runs unchanged.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from botocore.awsrequest import AWSResponse

from orchestrator.launchers.base import Launcher, LauncherConfigError, LaunchRequest
from orchestrator.launchers.ec2.launcher import Ec2Launcher
from orchestrator.launchers.ec2.settings import Ec2Settings
from tests.support.aws import FakeAws

ORCH = "orch-test"
TEMPLATE = "spotswarm-worker"
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
        vpc = self.ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        self.subnets = tuple(
            self.ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{i}.0/24", AvailabilityZone=f"us-east-1{z}")[
                "Subnet"
            ]["SubnetId"]
            for i, z in ((1, "a"), (2, "b"))
        )
        self.ec2.create_launch_template(
            LaunchTemplateName=TEMPLATE,
            LaunchTemplateData={"ImageId": "ami-12345678", "InstanceType": TYPES[0]},
        )

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
    attr = cloud.ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    cloud_config = yaml.safe_load(base64.b64decode(attr["UserData"]["Value"]))
    env_file = next(f for f in cloud_config["write_files"] if f["path"] == "/etc/spotswarm/worker.env")
    lines = base64.b64decode(env_file["content"]).decode().splitlines()
    return dict(line.split("=", 1) for line in lines)


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
