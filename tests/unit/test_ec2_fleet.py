"""The pure parts of the EC2 launcher: run options, the CreateFleet request, error kinds."""

from __future__ import annotations

import pytest

from orchestrator.launchers.base import LauncherConfigError
from orchestrator.launchers.ec2.fleet import (
    ErrorKind,
    LaunchPlan,
    Market,
    build_fleet_request,
    classify,
    client_token,
    pool_errors,
    resolve_plan,
)

DEFAULTS = LaunchPlan(
    instance_types=("g5.xlarge",),
    subnet_ids=(),
    launch_template="spotswarm-worker",
    max_price=None,
    on_demand_fallback_after=None,
    gpus=True,
    worker_image="w:1",
)


def test_run_options_override_defaults_in_the_forms_the_cli_sends() -> None:
    plan = resolve_plan(
        {
            "instance_types": "g6.xlarge, g5.xlarge,g6.xlarge",
            "subnet_ids": ["subnet-0123456789abcdef0"],
            "max_price": 0.6,
            "on_demand_fallback_after": "4",
            "launch_template": "lt-0123456789abcdef0",
            "gpus": False,
        },
        DEFAULTS,
    )
    assert plan.instance_types == ("g6.xlarge", "g5.xlarge"), "order kept, duplicates dropped"
    assert plan.max_price == "0.6" and plan.on_demand_fallback_after == 4 and plan.gpus is False
    assert resolve_plan({}, DEFAULTS) == DEFAULTS


@pytest.mark.parametrize(
    "options",
    [
        {"instance_types": []},
        {"instance_types": ["G5 XL"]},
        {"subnet_ids": ["sub-1"]},
        {"max_price": -1},
        {"max_price": "cheap"},
        {"on_demand_fallback_after": -2},
        {"on_demand_fallback_after": True},
        {"gpus": "yes"},
        {"launch_template": "x"},
        {"spot": True},
    ],
)
def test_bad_run_options_are_config_errors(options: dict) -> None:
    with pytest.raises(LauncherConfigError):
        resolve_plan(options, DEFAULTS)


def test_spot_request_covers_every_pool_with_priority_and_max_price() -> None:
    plan = resolve_plan(
        {"instance_types": ["g5.xlarge", "g4dn.xlarge"], "subnet_ids": ["subnet-aaaaaaaa", "subnet-bbbbbbbb"],
         "max_price": "0.5"},
        DEFAULTS,
    )  # fmt: skip
    request = build_fleet_request(plan, Market.spot, [{"Key": "k", "Value": "v"}], "#cloud-config\n", "tok")
    overrides = request["LaunchTemplateConfigs"][0]["Overrides"]
    assert [(o["InstanceType"], o["SubnetId"], o["Priority"]) for o in overrides] == [
        ("g5.xlarge", "subnet-aaaaaaaa", 0.0), ("g5.xlarge", "subnet-bbbbbbbb", 0.0),
        ("g4dn.xlarge", "subnet-aaaaaaaa", 1.0), ("g4dn.xlarge", "subnet-bbbbbbbb", 1.0),
    ]  # fmt: skip
    assert {o["MaxPrice"] for o in overrides} == {"0.5"}
    assert request["Type"] == "instant" and request["TargetCapacitySpecification"]["TotalTargetCapacity"] == 1
    assert (
        request["LaunchTemplateConfigs"][0]["LaunchTemplateSpecification"]["LaunchTemplateName"]
        == "spotswarm-worker"
    )
    assert {t["ResourceType"] for t in request["TagSpecifications"]} == {"instance", "fleet"}

    on_demand = build_fleet_request(plan, Market.on_demand, [], "x", "tok")
    assert (
        "SpotOptions" not in on_demand and on_demand["OnDemandOptions"]["AllocationStrategy"] == "prioritized"
    )
    assert all("MaxPrice" not in o for o in on_demand["LaunchTemplateConfigs"][0]["Overrides"])


def test_error_codes_sort_into_capacity_config_and_transient() -> None:
    assert classify("InsufficientInstanceCapacity") is ErrorKind.capacity
    assert classify("SpotMaxPriceTooLow") is ErrorKind.capacity
    assert classify("MaxSpotInstanceCountExceeded") is ErrorKind.capacity
    assert classify("InvalidLaunchTemplateName.NotFoundException") is ErrorKind.config
    assert classify("UnauthorizedOperation") is ErrorKind.config
    assert classify("RequestLimitExceeded") is ErrorKind.transient


def test_pool_errors_name_the_pool_and_tokens_differ_per_attempt() -> None:
    override = {"InstanceType": "g5.xlarge", "SubnetId": "subnet-aaaaaaaa"}
    error_entry = {"ErrorCode": "InsufficientInstanceCapacity", "ErrorMessage": "none",
                   "LaunchTemplateAndOverrides": {"Overrides": override}}  # fmt: skip
    response = {"Errors": [error_entry]}
    [error] = pool_errors(response)
    assert error.describe() == "g5.xlarge/subnet-aaaaaaaa: InsufficientInstanceCapacity"
    tokens = {client_token("orch", "req-" + "x" * 60, attempt) for attempt in (1, 2, 3)}
    assert len(tokens) == 3 and all(len(t) <= 64 for t in tokens)
