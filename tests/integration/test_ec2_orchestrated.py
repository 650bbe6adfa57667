"""The ``ec2`` launcher driven by a real ``spotswarm serve``: runs created through the API become spot
instances (four workers on one of four GPUs), scale-downs and lost instances are acted on, orphans are
cleaned up after a restart, and launches without capacity fall back or back off.

Everything runs as in production except AWS: a moto server process stands in for EC2, behind a
:class:`~tests.support.ec2_capacity.CapacityProxy` that plays EC2's spare capacity and records the
``CreateFleet`` calls. The orchestrator gets the endpoint and fake credentials through its environment,
exactly the settings the Terraform module writes. Instances in moto never boot the worker agent, so
the launch timeout is long; where a test needs a registered worker it registers with the token and
request id read back from the instance's user data, as the agent on that instance would.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import datetime
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import api
from tests.support.aws import REGION, WORKER_TEMPLATE, FakeAws, worker_env_of, worker_network
from tests.support.ec2_capacity import CapacityProxy
from tests.support.orchestrator import Orchestrator, start_orchestrator
from tests.support.processes import ProcessRegistry
from tests.support.specs import run_spec
from tests.support.terraform import evaluate, module_workspace
from tests.support.waiting import wait_until

ORCH_ID = "orch-e2e"
TEMPLATE = WORKER_TEMPLATE
TYPES = ["g4dn.xlarge", "g5.xlarge"]
DEFAULT_MAX_PRICE = "1.25"
PUBLIC_URL = "http://10.0.0.5:8000"  # what workers would use to reach the API (never dialled here)
WAIT_S = 30.0


class Cloud:
    """A VPC with two subnets in two zones and the worker launch template, on moto; read-back helpers."""

    def __init__(self, fake: FakeAws) -> None:
        self.ec2 = fake.client("ec2")
        self.subnets = list(worker_network(self.ec2, TYPES[0]))

    def instances(self, run: str, *, alive: bool = True) -> list[dict[str, Any]]:
        """This orchestrator's instances of ``run`` (pending/running only unless ``alive`` is False)."""
        filters = [
            {"Name": "tag:spotswarm:orchestrator", "Values": [ORCH_ID]},
            {"Name": "tag:spotswarm:run", "Values": [run]},
        ]
        if alive:
            filters.append({"Name": "instance-state-name", "Values": ["pending", "running"]})
        reservations = self.ec2.describe_instances(Filters=filters)["Reservations"]
        return [i for r in reservations for i in r["Instances"]]

    def state(self, instance_id: str) -> str:
        raw = self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
        return str(raw["State"]["Name"])

    def worker_env(self, instance_id: str) -> dict[str, str]:
        """The worker's environment file, decoded from the instance's cloud-init user data."""
        return worker_env_of(self.ec2, instance_id)


def tags(raw: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in raw.get("Tags", [])}


def fleet_instances(fleet: dict[str, Any]) -> set[str]:
    return {i for group in fleet.get("Instances", []) for i in group["InstanceIds"]}


class Ec2Orchestrator:
    """One ``spotswarm serve`` with the ec2 launcher on the fake cloud, shared by this module's tests.

    Tests use their own run names and read only their own instances (by the run tag), and stop their
    runs when done. :meth:`restart` replaces the server with a new process on the same data dir.
    """

    def __init__(
        self, processes: ProcessRegistry, tmp_path: Path, cloud: Cloud, capacity: CapacityProxy
    ) -> None:
        self.processes = processes
        self.tmp_path = tmp_path
        self.cloud = cloud
        self.capacity = capacity
        self.starts = 0
        self.orch = self._start()

    def _start(self, port: int | None = None, dht_port: int | None = None) -> Orchestrator:
        self.starts += 1
        return start_orchestrator(
            self.processes,
            self.tmp_path / "data",
            extra_env=orchestrator_env(self.capacity.url, self.tmp_path, self.cloud.subnets),
            name=f"orchestrator-{self.starts}",
            port=port,
            dht_port=dht_port,
        )

    def restart(self, before_start: Callable[[], None] = lambda: None) -> Orchestrator:
        """Stop the server (SIGTERM, as systemd would), call ``before_start``, start it again."""
        old = self.orch
        assert old.stop() in (0, -15), old.proc.log()[-3000:]
        before_start()
        self.orch = self._start(port=old.port, dht_port=old.dht_port)
        return self.orch


@pytest.fixture(scope="module")
def ec2(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ec2Orchestrator]:
    """The module's fake cloud (moto emptied once), capacity proxy and orchestrator; all stopped after."""
    fake = FakeAws(moto_endpoint)
    fake.reset()
    tmp_path = tmp_path_factory.mktemp("ec2-orchestrated")
    processes = ProcessRegistry(tmp_path)
    with CapacityProxy(moto_endpoint) as capacity:
        try:
            yield Ec2Orchestrator(processes, tmp_path, Cloud(fake), capacity)
        finally:
            processes.kill_all()


@pytest.fixture(scope="module")
def deployment_tags(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The tags the Terraform module puts on the orchestrator's own instance, for a deployment named
    ``ORCH_ID``. (The module's SPOTSWARM_EC2_ORCHESTRATOR_ID is that name and a random suffix made at
    apply, unknown here; the tests' orchestrator uses ``ORCH_ID`` itself, the harder case: the name
    and the workers' tag value are the same.)"""
    module = module_workspace(tmp_path_factory.mktemp("tf-tags"))
    return dict(evaluate(module, "local.orchestrator_instance_tags", {"name": ORCH_ID}))


def orchestrator_env(endpoint: str, tmp_path: Path, subnets: list[str]) -> dict[str, str]:
    """``spotswarm serve`` with the reconcile loop on a short tick and the ec2 launcher on the fake cloud."""
    missing = str(tmp_path / "no-aws-config")
    return {
        "SPOTSWARM_RECONCILE": "true",
        "SPOTSWARM_RECONCILE_INTERVAL_S": "0.5",
        "SPOTSWARM_LAUNCH_TIMEOUT_S": "600",  # moto's instances never run an agent
        "SPOTSWARM_RETIRE_GRACE_S": "1",
        "SPOTSWARM_LAUNCH_BACKOFF_BASE_S": "1",
        "SPOTSWARM_MAX_START_FAILURES": "3",
        "SPOTSWARM_CHECK_IMPORTS": "false",
        "SPOTSWARM_PUBLIC_URL": PUBLIC_URL,
        "SPOTSWARM_EC2_LAUNCH_TEMPLATE": TEMPLATE,
        "SPOTSWARM_EC2_ORCHESTRATOR_ID": ORCH_ID,
        "SPOTSWARM_EC2_REGION": REGION,
        "SPOTSWARM_EC2_ENDPOINT_URL": endpoint,
        "SPOTSWARM_EC2_WORKER_IMAGE": "registry.example/spotswarm-worker:1.0",
        # Defaults of every ec2 run (a run's launcher_options override them).
        "SPOTSWARM_EC2_INSTANCE_TYPES": ",".join(TYPES),
        "SPOTSWARM_EC2_SUBNET_IDS": ",".join(subnets),
        "SPOTSWARM_EC2_MAX_PRICE": DEFAULT_MAX_PRICE,
        # Fake credentials, and nothing from a real AWS configuration of the machine running the tests.
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_CONFIG_FILE": missing,
        "AWS_SHARED_CREDENTIALS_FILE": missing,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def create_ec2_run(ec2: Ec2Orchestrator, name: str, desired: int, **options: Any) -> None:
    """An ec2 run of ``desired`` workers; ``options`` are its launcher_options (none: the defaults)."""
    spec = run_spec(name, launcher="ec2", launcher_options=options, desired_workers=desired)
    with ec2.orch.admin() as http:
        response = http.post(api.runs(), json=spec)
    assert response.status_code == 201, response.text


def admin_post(ec2: Ec2Orchestrator, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    with ec2.orch.admin() as http:
        response = http.post(f"/api/v1{path}", json=body or {})
    assert response.status_code == 200, response.text
    return dict(response.json())


def read(ec2: Ec2Orchestrator, path: str) -> Any:
    with ec2.orch.client() as http:
        response = http.get(f"/api/v1{path}")
        response.raise_for_status()
        return response.json()


def workers(ec2: Ec2Orchestrator, run: str) -> list[dict[str, Any]]:
    return list(read(ec2, f"/runs/{run}/workers?limit=100")["items"])


def events(ec2: Ec2Orchestrator, run: str) -> list[dict[str, Any]]:
    return list(read(ec2, f"/runs/{run}/events?limit=1000")["items"])


def reconcile_ticks(ec2: Ec2Orchestrator) -> int:
    """Reconcile ticks so far, as Prometheus would scrape them."""
    with ec2.orch.client() as http:
        text = http.get("/metrics").raise_for_status().text
    match = re.search(r"^spotswarm_reconcile_ticks_total (\S+)$", text, re.M)
    assert match, "the reconcile tick counter is exported"
    return int(float(match[1]))


def identities(ec2: Ec2Orchestrator, run: str) -> list[tuple[str, str, str, str]]:
    """Who each worker of ``run`` is: id, request id, handle and state."""
    return [(w["id"], w["request_id"], w["launcher_handle"], w["state"]) for w in workers(ec2, run)]


def recorded_worker(ec2: Ec2Orchestrator, run: str, instance_id: str) -> dict[str, Any]:
    """The worker row whose handle is ``instance_id``, once its launch details are recorded."""
    found = [w for w in workers(ec2, run) if w["launcher_handle"] == instance_id and w["launch_details"]]
    return found[0] if found else {}


def live_handles(ec2: Ec2Orchestrator, run: str) -> set[str]:
    return {w["launcher_handle"] for w in workers(ec2, run) if w["state"] in ("launching", "running")}


def launched(ec2: Ec2Orchestrator, run: str, count: int) -> list[dict[str, Any]]:
    """Wait until ``run`` has ``count`` live instances, each the handle of a live worker; return them."""

    def ready() -> list[dict[str, Any]]:
        instances = ec2.cloud.instances(run)
        ids = {i["InstanceId"] for i in instances}
        return instances if len(instances) == count and ids == live_handles(ec2, run) else []

    return wait_until(ready, WAIT_S, message=f"{count} live instance(s) of {run}, each a live worker")


def stop_run(ec2: Ec2Orchestrator, run: str) -> None:
    """Stop ``run`` and wait until it is stopped with none of its instances left alive."""
    admin_post(ec2, f"/runs/{run}/stop")
    wait_until(
        lambda: read(ec2, f"/runs/{run}")["state"] in ("stopped", "failed") and not ec2.cloud.instances(run),
        WAIT_S,
        message=f"run {run} stopped, its instances terminated",
    )


def register_as_agent(ec2: Ec2Orchestrator, instance_id: str) -> dict[str, Any]:
    """Register as the agent on ``instance_id`` would: with the token and request id of its user data."""
    env = ec2.cloud.worker_env(instance_id)
    body = {
        "hostname": f"ip-{instance_id}",
        "request_id": env["SPOTSWARM_REQUEST_ID"],
        "launcher_handle": instance_id,
    }
    response = httpx.post(
        ec2.orch.url + api.register(),
        json=body,
        headers={"Authorization": f"Bearer {env['SPOTSWARM_JOIN_TOKEN']}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


# Each time limit has room for the module's orchestrator to start on a busy machine (whichever test
# runs first starts it).
@pytest.mark.timeout(180)
def test_ec2_run_launches_tagged_spot_instances_that_carry_their_worker_config(ec2: Ec2Orchestrator) -> None:
    options = {"instance_types": TYPES[::-1], "subnet_ids": ec2.cloud.subnets[:1], "max_price": "0.75"}
    create_ec2_run(ec2, "spot-a", desired=2, **options)

    instances = launched(ec2, "spot-a", 2)

    for raw in instances:
        instance_id = raw["InstanceId"]
        tag = tags(raw)
        assert raw["InstanceLifecycle"] == "spot"
        assert raw["InstanceType"] in TYPES and raw["SubnetId"] == ec2.cloud.subnets[0]
        assert tag["spotswarm:orchestrator"] == ORCH_ID and tag["spotswarm:run"] == "spot-a"
        assert tag["spotswarm:market"] == "spot"
        # What the workers table shows: the instance id, and its type, zone and price.
        row = wait_until(
            partial(recorded_worker, ec2, "spot-a", instance_id),
            WAIT_S,
            message=f"launch details of {instance_id} recorded",
        )
        assert row["state"] == "launching" and row["launcher"] == "ec2"
        assert tag["spotswarm:request-id"] == row["request_id"]
        details = row["launch_details"]
        assert details["instance_type"] == raw["InstanceType"] and details["market"] == "spot"
        assert details["availability_zone"] == raw["Placement"]["AvailabilityZone"]
        assert isinstance(details["price_usd_per_hour"], float)
        # The user data carries everything the agent on the instance needs to join.
        env = ec2.cloud.worker_env(instance_id)
        assert env["SPOTSWARM_URL"] == PUBLIC_URL
        assert env["SPOTSWARM_REQUEST_ID"] == row["request_id"]
        assert env["SPOTSWARM_JOIN_TOKEN"].startswith("ssl_"), "a per-worker launch token, not the run's"
        assert env["SPOTSWARM_METADATA_URL"] == "http://169.254.169.254"
    assert len({tags(raw)["spotswarm:request-id"] for raw in instances}) == 2

    # The fleets EC2 was asked for: spot over the run's (type, subnet) pools, in its order of preference,
    # capped at its price.
    ids = {raw["InstanceId"] for raw in instances}
    fleets = [f for f in ec2.cloud.ec2.describe_fleets()["Fleets"] if ids & fleet_instances(f)]
    assert len(fleets) == 2
    for fleet in fleets:
        assert fleet["Type"] == "instant"
        assert fleet["TargetCapacitySpecification"]["DefaultTargetCapacityType"] == "spot"
        assert fleet["SpotOptions"]["AllocationStrategy"] == "capacity-optimized-prioritized"
        overrides = fleet["LaunchTemplateConfigs"][0]["Overrides"]
        assert [(o["InstanceType"], o["SubnetId"], o["MaxPrice"], o["Priority"]) for o in overrides] == [
            (TYPES[1], ec2.cloud.subnets[0], "0.75", 0.0),
            (TYPES[0], ec2.cloud.subnets[0], "0.75", 1.0),
        ]
    assert ec2.capacity.markets_asked().count("spot") >= 2
    stop_run(ec2, "spot-a")


@pytest.mark.timeout(180)
def test_scaling_down_terminates_instances_and_stopping_terminates_the_rest(ec2: Ec2Orchestrator) -> None:
    create_ec2_run(ec2, "spot-scale", desired=3)  # no launcher_options: the orchestrator's defaults
    instances = launched(ec2, "spot-scale", 3)
    before = {raw["InstanceId"] for raw in instances}
    assert {raw["SubnetId"] for raw in instances} <= set(ec2.cloud.subnets)
    fleets = [f for f in ec2.cloud.ec2.describe_fleets()["Fleets"] if before & fleet_instances(f)]
    assert len(fleets) == 3
    for fleet in fleets:
        pools = {
            (o["InstanceType"], o["SubnetId"], o["MaxPrice"])
            for o in fleet["LaunchTemplateConfigs"][0]["Overrides"]
        }
        assert pools == {(t, s, DEFAULT_MAX_PRICE) for t in TYPES for s in ec2.cloud.subnets}

    admin_post(ec2, "/runs/spot-scale/scale", {"desired_workers": 1})

    kept = {raw["InstanceId"] for raw in launched(ec2, "spot-scale", 1)}
    gone = before - kept
    assert len(gone) == 2 and kept < before
    assert {ec2.cloud.state(i) for i in gone} <= {"shutting-down", "terminated"}
    ended = [w for w in workers(ec2, "spot-scale") if w["launcher_handle"] in gone]
    assert [w["state"] for w in ended] == ["exited", "exited"]
    assert all("scale-down" in w["state_reason"] for w in ended)
    assert sum(e["kind"] == "worker.retire" for e in events(ec2, "spot-scale")) == 2

    stop_run(ec2, "spot-scale")
    assert {ec2.cloud.state(i) for i in before} <= {"shutting-down", "terminated"}
    assert {w["state"] for w in workers(ec2, "spot-scale")} == {"exited"}


@pytest.mark.timeout(180)
def test_a_four_gpu_instance_runs_four_workers_and_ends_when_none_of_them_is_left(
    ec2: Ec2Orchestrator,
) -> None:
    options = {"instance_types": ["g5.12xlarge"]}
    spec = run_spec("spot-4gpu", launcher="ec2", launcher_options=options, desired_workers=4, max_workers=8)
    with ec2.orch.admin() as http:
        assert http.post(api.runs(), json=spec).status_code == 201
    [machine] = launched(ec2, "spot-4gpu", 1)
    peers = workers(ec2, "spot-4gpu")
    assert len(peers) == 4 and {w["launcher_handle"] for w in peers} == {machine["InstanceId"]}
    assert len({w["request_id"] for w in peers}) == 4, "each peer its own request id and worker row"

    admin_post(ec2, "/runs/spot-4gpu/scale", {"desired_workers": 5})
    second = next(r for r in launched(ec2, "spot-4gpu", 2) if r["InstanceId"] != machine["InstanceId"])
    assert "spotswarm:peer-1" not in tags(second), "one worker missing: an instance of one peer"

    admin_post(ec2, "/runs/spot-4gpu/scale", {"desired_workers": 4})  # the youngest goes: that one peer
    assert [r["InstanceId"] for r in launched(ec2, "spot-4gpu", 1)] == [machine["InstanceId"]]

    admin_post(ec2, "/runs/spot-4gpu/scale", {"desired_workers": 3})  # one peer of the 4-GPU instance
    wait_until(
        lambda: sum(w["state"] == "exited" for w in workers(ec2, "spot-4gpu")) == 2,
        WAIT_S,
        message="the retired peer ended",
    )
    assert [r["InstanceId"] for r in launched(ec2, "spot-4gpu", 1)] == [machine["InstanceId"]]
    assert ec2.cloud.state(machine["InstanceId"]) == "running", "its other three peers keep it"

    stop_run(ec2, "spot-4gpu")  # none of its peers is left: the instance goes
    assert ec2.cloud.state(machine["InstanceId"]) in ("shutting-down", "terminated")


@pytest.mark.timeout(180)
def test_instances_terminated_behind_the_orchestrators_back_are_replaced(ec2: Ec2Orchestrator) -> None:
    create_ec2_run(ec2, "spot-lost", desired=2)
    first, second = (raw["InstanceId"] for raw in launched(ec2, "spot-lost", 2))
    registered = register_as_agent(ec2, first)  # the agent on `first` booted; `second` is still booting
    wait_until(lambda: read(ec2, "/runs/spot-lost")["state"] == "running", WAIT_S, message="run running")

    ec2.cloud.ec2.terminate_instances(InstanceIds=[first, second])  # e.g. reclaimed, or by hand

    replacements = {raw["InstanceId"] for raw in launched(ec2, "spot-lost", 2)}
    assert not replacements & {first, second}
    by_handle = {w["launcher_handle"]: w for w in workers(ec2, "spot-lost")}
    assert by_handle[first]["id"] == registered["worker_id"]
    assert by_handle[first]["state"] == "lost", "a registered worker whose instance vanished is lost"
    assert by_handle[second]["state"] == "failed", "one that never registered failed at start-up"
    assert "gone" in by_handle[first]["state_reason"]
    kinds = [(e["kind"], e["worker_id"]) for e in events(ec2, "spot-lost")]
    assert ("run.start_failure", None) in kinds
    new_ids = [by_handle[h]["id"] for h in replacements]
    assert all(("worker.launching", wid) in kinds for wid in new_ids), "each replacement is an event"
    stop_run(ec2, "spot-lost")


@pytest.mark.timeout(180)
def test_no_spot_capacity_falls_back_to_on_demand_after_the_configured_failures(
    ec2: Ec2Orchestrator,
) -> None:
    ec2.capacity.exhaust("spot")
    try:
        calls_before = len(ec2.capacity.markets_asked())
        create_ec2_run(ec2, "spot-fallback", desired=1, on_demand_fallback_after=2)

        [raw] = launched(ec2, "spot-fallback", 1)
    finally:
        ec2.capacity.restore()

    assert "InstanceLifecycle" not in raw and tags(raw)["spotswarm:market"] == "on-demand"
    # First launch: spot only, no capacity (a start failure). Second: spot again, then on-demand.
    assert ec2.capacity.markets_asked()[calls_before:] == ["spot", "spot", "on-demand"]
    rows = sorted(workers(ec2, "spot-fallback"), key=lambda w: w["id"])
    assert [w["state"] for w in rows] == ["failed", "launching"]
    assert "InsufficientInstanceCapacity" in rows[0]["state_reason"]
    assert not rows[0]["launcher_handle"], "nothing was launched for the failed attempt"
    assert rows[1]["launcher_handle"] == raw["InstanceId"]
    history = events(ec2, "spot-fallback")
    failures = [e for e in history if e["kind"] == "run.no_capacity"]
    assert len(failures) == 1 and "no spot capacity" in failures[0]["message"]
    assert not [e for e in history if e["kind"] == "run.start_failure"], "no capacity is no start failure"
    launched_events = [e for e in history if e["kind"] == "worker.launched"]
    assert [e["worker_id"] for e in launched_events] == [rows[1]["id"]]
    stop_run(ec2, "spot-fallback")


@pytest.mark.timeout(180)
def test_without_capacity_launches_back_off_the_run_waits_and_launches_when_capacity_is_back(
    ec2: Ec2Orchestrator,
) -> None:
    ec2.capacity.exhaust("spot")
    try:
        create_ec2_run(ec2, "spot-dry", desired=1)

        def four_refusals() -> list[datetime]:
            history = events(ec2, "spot-dry")
            found = [datetime.fromisoformat(e["at"]) for e in history if e["kind"] == "run.no_capacity"]
            return found if len(found) >= 4 else []

        # more refusals than the start-up failures (3) that fail a run
        refusals = wait_until(four_refusals, WAIT_S, message="four launches refused for capacity")
        run = read(ec2, "/runs/spot-dry")
        assert run["state"] == "pending", "a market without capacity never fails a run"
        gaps = [(b - a).total_seconds() for a, b in pairwise(refusals)]
        assert gaps[0] >= 1.0 and gaps[1] >= 2.0 and gaps[2] >= 4.0, f"launches back off: {gaps}"
        assert ec2.cloud.instances("spot-dry", alive=False) == [], "nothing ever launched"
    finally:
        ec2.capacity.restore()

    [raw] = launched(ec2, "spot-dry", 1)  # capacity is back: the next try launches, no resume needed
    assert raw["InstanceLifecycle"] == "spot"
    assert read(ec2, "/runs/spot-dry")["state"] == "pending"  # no agent boots on moto: none registers
    stop_run(ec2, "spot-dry")


def start_instance(ec2: Ec2Orchestrator, instance_tags: dict[str, str]) -> str:
    """An instance started outside the launcher (by hand, or by Terraform) with exactly these tags."""
    reservation = ec2.cloud.ec2.run_instances(
        ImageId="ami-12345678",
        InstanceType=TYPES[0],
        MinCount=1,
        MaxCount=1,
        SubnetId=ec2.cloud.subnets[0],
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in instance_tags.items()]}
        ],
    )
    return str(reservation["Instances"][0]["InstanceId"])


@pytest.mark.timeout(300)
def test_the_deployments_own_instance_outlives_many_reconcile_ticks_beside_a_run(
    ec2: Ec2Orchestrator, deployment_tags: dict[str, str]
) -> None:
    own = start_instance(ec2, deployment_tags)  # the orchestrator's machine, as Terraform tags it
    create_ec2_run(ec2, "spot-beside", desired=1)
    launched(ec2, "spot-beside", 1)

    ticks = reconcile_ticks(ec2)
    wait_until(lambda: reconcile_ticks(ec2) >= ticks + 20, WAIT_S, message="20 more reconcile ticks")
    stop_run(ec2, "spot-beside")  # terminating the run's workers leaves it alone too

    assert ec2.cloud.state(own) == "running"
    assert own not in ec2.orch.proc.log(), "never even considered an orphan"
    ec2.cloud.ec2.terminate_instances(InstanceIds=[own])


@pytest.mark.timeout(240)
def test_after_a_restart_known_instances_are_adopted_and_orphans_terminated(ec2: Ec2Orchestrator) -> None:
    create_ec2_run(ec2, "spot-restart", desired=2)
    known = {raw["InstanceId"] for raw in launched(ec2, "spot-restart", 2)}
    workers_before = identities(ec2, "spot-restart")
    orphans: list[str] = []
    foreign: list[str] = []
    ours = {"spotswarm:orchestrator": ORCH_ID, "spotswarm:run": "spot-restart"}

    def launch_orphans() -> None:
        """While the orchestrator is down: an instance with its tags and a request id it never made, and
        one with its tags but no request id (not launched by it: made by hand)."""
        orphans.append(start_instance(ec2, {**ours, "spotswarm:request-id": "spot-restart-000000000000"}))
        foreign.append(start_instance(ec2, {"spotswarm:orchestrator": ORCH_ID}))

    calls_before = len(ec2.capacity.markets_asked())
    ec2.restart(before_start=launch_orphans)

    wait_until(
        lambda: {ec2.cloud.state(i) for i in orphans} <= {"shutting-down", "terminated"},
        WAIT_S,
        message="the orphan terminated",
    )
    ticks = reconcile_ticks(ec2)
    wait_until(lambda: reconcile_ticks(ec2) >= ticks + 5, WAIT_S, message="5 more reconcile ticks")
    assert [ec2.cloud.state(i) for i in foreign] == ["running"], "no request id: never terminated"
    ec2.cloud.ec2.terminate_instances(InstanceIds=foreign)
    assert {raw["InstanceId"] for raw in launched(ec2, "spot-restart", 2)} == known
    assert {ec2.cloud.state(i) for i in known} == {"running"}
    assert identities(ec2, "spot-restart") == workers_before, (
        "adopted as they were: none new, none relaunched"
    )
    assert len(ec2.capacity.markets_asked()) == calls_before, "no CreateFleet after the restart"
    stop_run(ec2, "spot-restart")
