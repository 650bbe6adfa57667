"""A real moto server (its own process, on a free port) that stands in for AWS in the tests, and the EC2
world the launcher's tests build on it (:func:`worker_network`, :func:`worker_env_of`).

Its fixtures are registered for every test by ``tests/conftest.py`` (``pytest_plugins``). One server runs
for the whole session; :func:`aws` resets its state before each test, so tests never see each
other's buckets or instances.
"""

from __future__ import annotations

import base64
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
import yaml

from tests.support.ports import free_port
from tests.support.processes import VENV_BIN, ManagedProcess
from tests.support.waiting import wait_until

REGION = "us-east-1"
#: the launch template of the workers' instances, as the Terraform module names it
WORKER_TEMPLATE = "spotswarm-worker"
_FAKE_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


@dataclass(frozen=True)
class FakeAws:
    """Where the fake cloud answers, and clients for it."""

    endpoint_url: str
    region: str = REGION

    def client(self, service: str) -> Any:
        """A boto3 client for ``service`` that talks to the moto server only."""
        return boto3.client(
            service, region_name=self.region, endpoint_url=self.endpoint_url, **_FAKE_CREDENTIALS
        )

    def reset(self) -> None:
        """Forget every resource (moto's own reset endpoint)."""
        request = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST", data=b"")
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()


def _answers(url: str) -> bool:
    with urllib.request.urlopen(f"{url}/moto-api/", timeout=2) as response:
        return response.status == 200


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start ``moto_server`` on 127.0.0.1 for the session; killed (by process group) at the end."""
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    proc = ManagedProcess(
        [str(VENV_BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        log,
        # No real credentials or region leak into the fake cloud; unknown instance types are refused.
        env={"AWS_DEFAULT_REGION": REGION, "MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION": "true"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: proc.alive() and _answers(url), timeout_s=30, message=lambda: f"moto server\n{proc.log()}"
        )
        yield url
    finally:
        proc.kill()


@pytest.fixture
def aws(moto_endpoint: str) -> FakeAws:
    """The session's moto server, emptied for this test."""
    fake = FakeAws(moto_endpoint)
    fake.reset()
    return fake


def worker_network(ec2: Any, instance_type: str) -> tuple[str, ...]:
    """On the fake cloud (``ec2``, a client of it): a VPC with two subnets in two zones and the workers'
    launch template (:data:`WORKER_TEMPLATE`, of ``instance_type``); returns the subnets' ids."""
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    zones = (f"{REGION}a", f"{REGION}b")
    subnets = tuple(
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{i}.0/24", AvailabilityZone=zone)["Subnet"]["SubnetId"]
        for i, zone in enumerate(zones, start=1)
    )
    ec2.create_launch_template(
        LaunchTemplateName=WORKER_TEMPLATE,
        LaunchTemplateData={"ImageId": "ami-12345678", "InstanceType": instance_type},
    )
    return subnets


def worker_env_of(ec2: Any, instance_id: str) -> dict[str, str]:
    """The worker's environment file, decoded from the instance's cloud-init user data."""
    attr = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    cloud_config = yaml.safe_load(base64.b64decode(attr["UserData"]["Value"]))
    env_file = next(f for f in cloud_config["write_files"] if f["path"] == "/etc/spotswarm/worker.env")
    lines = base64.b64decode(env_file["content"]).decode().splitlines()
    return dict(line.split("=", 1) for line in lines)
