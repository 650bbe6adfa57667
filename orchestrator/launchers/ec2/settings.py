"""The ``ec2`` launcher's settings: ``Settings.ec2``, and what :class:`~.launcher.Ec2Launcher` is built from.

Declared beside the launcher, which takes this model itself; the orchestrator's settings nest it. Each
field is read from ``SPOTSWARM_EC2_<FIELD>`` and ``--ec2-<field>`` of ``spotswarm serve`` (the Terraform
module sets them). Importing this module does not import boto3.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import AliasGenerator, BaseModel, ConfigDict, Field, field_validator

from worker.protocol.comma_list import CommaList


class Ec2Settings(BaseModel):
    """Account-wide defaults of the ``ec2`` launcher; a run's ``launcher_options`` override the launch
    plan's fields (instance types, subnets, max price, on-demand fallback, image)."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=AliasGenerator(validation_alias=lambda name: f"ec2_{name}"),
        validate_by_name=True,
        validate_by_alias=True,
    )

    launch_template: str | None = Field(
        default=None, description="Worker launch template name or id; setting it enables the ec2 launcher."
    )
    orchestrator_id: str = Field(
        default="spotswarm", description="Value of the spotswarm:orchestrator tag on every instance launched."
    )
    region: str | None = Field(default=None, description="AWS region of the ec2 launcher.")
    endpoint_url: str | None = Field(default=None, description="EC2 API endpoint (tests point it at moto).")
    worker_image: str = Field(
        default="spotswarm-worker:latest", description="Container image the worker user data starts."
    )
    instance_types: CommaList = Field(
        default_factory=list, description="Comma-separated default instance types (a run's options override)."
    )
    subnet_ids: CommaList = Field(
        default_factory=list, description="Comma-separated default subnets, one per zone to spread over."
    )
    max_price: str | None = Field(default=None, description="Default spot max price in USD per hour.")
    on_demand_fallback_after: int | None = Field(
        default=None, ge=0, description="Spot failures in a row after which a run falls back to on-demand."
    )
    user_data_template: Path | None = Field(
        default=None, description="Worker cloud-init template. Default: deploy/cloud-init/worker.yaml."
    )

    @field_validator("max_price", "on_demand_fallback_after", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        """An empty value is no value: the Terraform module writes ``SPOTSWARM_EC2_MAX_PRICE=`` and
        ``SPOTSWARM_EC2_ON_DEMAND_FALLBACK_AFTER=`` for its null defaults (as the launcher reads a run's
        options: ``fleet.py``)."""
        return None if value == "" else value
