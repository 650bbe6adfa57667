"""Pure pieces of the EC2 launcher: run options, the ``CreateFleet`` request, and AWS error kinds.

One instance (one worker, or one per GPU: :mod:`.gpus`) is one EC2 Fleet of type ``instant`` with a
target of one instance. Its overrides are every (instance type, subnet) pair the run allows, so EC2
itself falls back from a pool without capacity to the next one within a single call;
``capacity-optimized-prioritized`` picks the pool least likely to be interrupted and breaks ties by the
order of ``instance_types``.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from orchestrator.launchers.base import PEERS_OPTION, LauncherConfigError, peers_option
from orchestrator.launchers.ec2.gpus import MAX_PEERS_PER_INSTANCE, default_peers, too_few_gpus

TAG_ORCHESTRATOR = "spotswarm:orchestrator"
TAG_RUN = "spotswarm:run"
TAG_REQUEST = "spotswarm:request-id"
TAG_MARKET = "spotswarm:market"
#: ``spotswarm:peer-1`` ... : the request ids of an instance's other peers (GPUs 1, 2, ...); the first
#: peer's is ``spotswarm:request-id``, which also names the instance's launch
TAG_PEER_PREFIX = "spotswarm:peer-"

MAX_INSTANCE_TYPES = 20
MAX_SUBNETS = 16
_INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")
_SUBNET = re.compile(r"^subnet-[0-9a-f]{8,17}$")
_TEMPLATE_ID = re.compile(r"^lt-[0-9a-f]{8,17}$")
_TEMPLATE_NAME = re.compile(r"^[A-Za-z0-9().\-/_]{3,128}$")


class Market(str, Enum):
    spot = "spot"
    on_demand = "on-demand"


@dataclass(frozen=True)
class LaunchPlan:
    """What one run asks of EC2, after defaults and validation."""

    instance_types: tuple[str, ...]
    subnet_ids: tuple[str, ...]
    launch_template: str
    max_price: str | None  # USD per instance-hour, spot only; None = EC2's default (on-demand price)
    on_demand_fallback_after: int | None  # consecutive spot failures before trying on-demand; None = never
    gpus: bool
    worker_image: str
    peers_per_machine: int = 1  # one peer per GPU: the option, else the fewest GPUs of the instance types


OPTION_NAMES = frozenset(LaunchPlan.__dataclass_fields__)


def resolve_plan(options: Mapping[str, Any], defaults: LaunchPlan) -> LaunchPlan:
    """Merge a run's ``launcher_options`` over ``defaults``; raises LauncherConfigError when invalid."""
    unknown = set(options) - OPTION_NAMES
    if unknown:
        raise LauncherConfigError(
            f"unknown ec2 launcher options {sorted(unknown)}; known: {sorted(OPTION_NAMES)}"
        )
    types = _names(options.get("instance_types", defaults.instance_types), "instance_types")
    subnets = _names(options.get("subnet_ids", defaults.subnet_ids), "subnet_ids")
    if not types or len(types) > MAX_INSTANCE_TYPES:
        raise LauncherConfigError(f"instance_types needs 1 to {MAX_INSTANCE_TYPES} entries, got {len(types)}")
    if len(subnets) > MAX_SUBNETS:
        raise LauncherConfigError(f"subnet_ids takes at most {MAX_SUBNETS} entries")
    for name in types:
        if not _INSTANCE_TYPE.match(name):
            raise LauncherConfigError(f"instance type {name!r} is not like 'g5.xlarge'")
    for subnet in subnets:
        if not _SUBNET.match(subnet):
            raise LauncherConfigError(f"subnet id {subnet!r} is not like 'subnet-0123abcd'")
    peers = _peers(options, types)
    template = str(options.get("launch_template", defaults.launch_template))
    if not (_TEMPLATE_ID.match(template) or _TEMPLATE_NAME.match(template)):
        raise LauncherConfigError(f"launch_template {template!r} is neither an lt- id nor a template name")
    return LaunchPlan(
        instance_types=types,
        subnet_ids=subnets,
        launch_template=template,
        max_price=_price(options.get("max_price", defaults.max_price)),
        on_demand_fallback_after=_fallback(
            options.get("on_demand_fallback_after", defaults.on_demand_fallback_after)
        ),
        gpus=_flag(options.get("gpus", defaults.gpus), "gpus"),
        worker_image=str(options.get("worker_image", defaults.worker_image)),
        peers_per_machine=peers,
    )


def _peers(options: Mapping[str, Any], types: Sequence[str]) -> int:
    """The run's peers per instance: its option, checked against its types' GPUs, or their default."""
    peers = peers_option(options, most=MAX_PEERS_PER_INSTANCE)
    if peers is None:
        return default_peers(types)
    short = too_few_gpus(types, peers) if options.get("gpus", True) else []
    if short:
        raise LauncherConfigError(
            f"{PEERS_OPTION}={peers} gives each peer a GPU of its own, and {', '.join(short)} has fewer: "
            f"list only instance types with at least {peers} GPUs, or lower {PEERS_OPTION}"
        )
    return peers


def _names(value: Any, option: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise LauncherConfigError(f"{option} must be a list of strings (or one comma-separated string)")
    return tuple(dict.fromkeys(value))  # order kept: it is the priority


def _price(value: Any) -> str | None:
    if value is None or value == "":
        return None
    try:
        price = float(value)
    except (TypeError, ValueError) as exc:
        raise LauncherConfigError(f"max_price {value!r} is not a number (USD per hour)") from exc
    if not 0 < price < 1000:
        raise LauncherConfigError(f"max_price {price} must lie in (0, 1000) USD per hour")
    return f"{price:.5f}".rstrip("0").rstrip(".")


def _fallback(value: Any) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LauncherConfigError(f"on_demand_fallback_after {value!r} must be a whole number >= 0 or null")
    return value


def _flag(value: Any, option: str) -> bool:
    if not isinstance(value, bool):
        raise LauncherConfigError(f"{option} must be true or false")
    return value


def client_token(orchestrator_id: str, request_id: str, attempt: int) -> str:
    """CreateFleet's idempotency token: one per (request, attempt), at most 64 characters.

    A new attempt needs a new token: EC2 answers a repeated token with the first call's result.
    """
    return hashlib.sha256(f"{orchestrator_id}/{request_id}/{attempt}".encode()).hexdigest()[:48]


def instance_tags(
    orchestrator_id: str, run_name: str, request_id: str, market: Market, siblings: Sequence[str] = ()
) -> list[dict[str, str]]:
    """The tags every worker instance carries; the IAM policy of the orchestrator requires the first.
    ``siblings``: the request ids of the instance's other peers, one ``spotswarm:peer-<gpu>`` tag each."""
    return [
        {"Key": TAG_ORCHESTRATOR, "Value": orchestrator_id},
        {"Key": TAG_RUN, "Value": run_name},
        {"Key": TAG_REQUEST, "Value": request_id},
        {"Key": TAG_MARKET, "Value": market.value},
        {"Key": "Name", "Value": f"spotswarm-{run_name}-{request_id[:8]}"},
        *({"Key": f"{TAG_PEER_PREFIX}{gpu}", "Value": rid} for gpu, rid in enumerate(siblings, 1)),
    ]


def peer_request_ids(tags: Mapping[str, str]) -> list[str]:
    """An instance's peers by GPU, from its tags: the request id, then ``spotswarm:peer-1``, ..."""
    peers = [tags[TAG_REQUEST]]
    while f"{TAG_PEER_PREFIX}{len(peers)}" in tags:
        peers.append(tags[f"{TAG_PEER_PREFIX}{len(peers)}"])
    return peers


def build_fleet_request(
    plan: LaunchPlan, market: Market, tags: Sequence[Mapping[str, str]], user_data: str, token: str
) -> dict[str, Any]:
    """Keyword arguments of ``ec2.create_fleet`` for one instance of ``plan`` on ``market``."""
    template_key = "LaunchTemplateId" if _TEMPLATE_ID.match(plan.launch_template) else "LaunchTemplateName"
    request: dict[str, Any] = {
        "Type": "instant",
        "ClientToken": token,
        "TargetCapacitySpecification": {"TotalTargetCapacity": 1, "DefaultTargetCapacityType": market.value},
        "LaunchTemplateConfigs": [
            {
                "LaunchTemplateSpecification": {
                    template_key: plan.launch_template,
                    "Version": "$Default",
                    "LaunchTemplateSpecificationUserData": base64.b64encode(user_data.encode()).decode(),
                },
                "Overrides": overrides(plan, market),
            }
        ],
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": list(tags)},
            {"ResourceType": "fleet", "Tags": list(tags)},
        ],
    }
    if market is Market.spot:
        request["SpotOptions"] = {
            "AllocationStrategy": "capacity-optimized-prioritized",
            "InstanceInterruptionBehavior": "terminate",
        }
    else:
        request["OnDemandOptions"] = {"AllocationStrategy": "prioritized"}
    return request


def overrides(plan: LaunchPlan, market: Market) -> list[dict[str, Any]]:
    """One override per (instance type, subnet); priority follows the order of ``instance_types``."""
    subnets: Iterable[str | None] = plan.subnet_ids or [None]
    result = []
    for priority, instance_type in enumerate(plan.instance_types):
        for subnet in subnets:
            override: dict[str, Any] = {"InstanceType": instance_type, "Priority": float(priority)}
            if subnet:
                override["SubnetId"] = subnet
            if market is Market.spot and plan.max_price:
                override["MaxPrice"] = plan.max_price
            result.append(override)
    return result


class ErrorKind(str, Enum):
    capacity = "capacity"  # try again later, elsewhere, or on-demand
    config = "config"  # will fail the same way until the request or the account changes
    transient = "transient"  # anything else: try again


CAPACITY_CODES = frozenset({
    "InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity",
    "InsufficientFreeAddressesInSubnet", "SpotMaxPriceTooLow", "MaxSpotInstanceCountExceeded",
    "InstanceLimitExceeded", "VcpuLimitExceeded", "UnfulfillableCapacity",
})  # fmt: skip
CONFIG_PREFIXES = (
    "InvalidParameter", "InvalidLaunchTemplate", "InvalidSubnet", "InvalidAMIID", "InvalidInstanceType",
    "InvalidKeyPair", "InvalidGroup", "InvalidFleetConfiguration", "MissingParameter",
    "UnauthorizedOperation", "AuthFailure", "OptInRequired", "InvalidUserData",
    "Unsupported",  # e.g. an instance type not offered in the subnet's zone
)  # fmt: skip


def classify(code: str) -> ErrorKind:
    """The kind of an EC2 error code (from an exception or from a fleet's ``Errors``)."""
    if code in CAPACITY_CODES:
        return ErrorKind.capacity
    if code.startswith(CONFIG_PREFIXES):
        return ErrorKind.config
    return ErrorKind.transient


@dataclass(frozen=True)
class PoolError:
    """One pool a fleet could not launch in."""

    code: str
    message: str
    instance_type: str | None
    subnet_id: str | None

    def describe(self) -> str:
        where = "/".join(p for p in (self.instance_type, self.subnet_id) if p) or "fleet"
        return f"{where}: {self.code}"


def pool_errors(response: Mapping[str, Any]) -> list[PoolError]:
    """The ``Errors`` of a CreateFleet answer, one per pool that failed."""
    result = []
    for error in response.get("Errors", []):
        override = error.get("LaunchTemplateAndOverrides", {}).get("Overrides", {})
        result.append(
            PoolError(
                code=str(error.get("ErrorCode", "Unknown")),
                message=str(error.get("ErrorMessage", "")),
                instance_type=override.get("InstanceType"),
                subnet_id=override.get("SubnetId"),
            )
        )
    return result


def launched_instance_ids(response: Mapping[str, Any]) -> list[str]:
    """Instance ids a CreateFleet answer reports as launched."""
    return [iid for group in response.get("Instances", []) for iid in group.get("InstanceIds", [])]
