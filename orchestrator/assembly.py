"""From one :class:`Settings` to a running orchestrator: launchers, checkpoint store, reconcile loop, app.

``spotswarm serve`` and ``spotswarm demo`` call :func:`build_app`; tests that need the reconcile loop
start ``spotswarm serve`` too, so the path users run is the path tested. Launchers:

- ``local`` is always available (workers are subprocesses of this machine, logs in the data dir);
- ``ec2`` is added when ``SPOTSWARM_EC2_LAUNCH_TEMPLATE`` is set (the Terraform module sets it).

Checkpoints go to S3 when ``SPOTSWARM_S3_BUCKET`` is set, else to ``<data_dir>/checkpoints``.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from fastapi import FastAPI

from orchestrator.app import create_app
from orchestrator.config import Settings
from orchestrator.launchers.base import Launcher
from orchestrator.launchers.local import LocalLauncher
from orchestrator.reconciler.loop import reconciler_service
from orchestrator.reconciler.policy import ReconcilePolicy
from orchestrator.storage.base import CheckpointStore

logger = logging.getLogger(__name__)


def public_url(settings: Settings) -> str:
    """The URL workers use to reach the API: the configured one, else the bind address."""
    if settings.public_url:
        return settings.public_url.rstrip("/")
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    return f"http://{host}:{settings.port}"


def reconcile_policy(settings: Settings) -> ReconcilePolicy:
    """The loop's timeouts and limits, from settings."""
    return ReconcilePolicy(
        heartbeat_timeout_s=settings.heartbeat_timeout_s,
        launch_timeout_s=settings.launch_timeout_s,
        retire_grace_s=settings.retire_grace_s,
        backoff_base_s=settings.launch_backoff_base_s,
        backoff_cap_s=settings.launch_backoff_cap_s,
        max_start_failures=settings.max_start_failures,
    )


def build_launchers(settings: Settings) -> dict[str, Launcher]:
    """The launchers this orchestrator offers, by name."""
    launchers: dict[str, Launcher] = {
        "local": LocalLauncher(
            settings.data_dir, grace_s=settings.retire_grace_s, pass_env=settings.worker_env
        ),
    }
    if settings.ec2_launch_template:
        from orchestrator.launchers.ec2.launcher import Ec2Launcher, Ec2LauncherConfig

        config = Ec2LauncherConfig(
            orchestrator_id=settings.ec2_orchestrator_id,
            launch_template=settings.ec2_launch_template,
            worker_image=settings.ec2_worker_image,
            region=settings.ec2_region,
            endpoint_url=settings.ec2_endpoint_url,
            instance_types=tuple(settings.ec2_instance_types),
            subnet_ids=tuple(settings.ec2_subnet_ids),
            max_price=settings.ec2_max_price,
            on_demand_fallback_after=settings.ec2_on_demand_fallback_after,
        )
        if settings.ec2_user_data_template is not None:
            config = replace(config, user_data_template=settings.ec2_user_data_template)
        launchers["ec2"] = Ec2Launcher(config)
    return launchers


def build_store(settings: Settings) -> CheckpointStore:
    """S3 when a bucket is configured, else the local checkpoint directory."""
    if settings.s3_bucket:
        from orchestrator.storage.s3 import S3Store, S3StoreConfig

        return S3Store(
            S3StoreConfig(
                bucket=settings.s3_bucket,
                prefix=settings.s3_prefix,
                region=settings.s3_region or settings.ec2_region,
                endpoint_url=settings.s3_endpoint_url,
            )
        )
    from orchestrator.storage.local import LocalCheckpointStore

    return LocalCheckpointStore(settings.resolved_checkpoint_dir())


def build_app(settings: Settings) -> FastAPI:
    """The orchestrator with its launchers, checkpoint store and (unless disabled) the reconcile loop."""
    services = []
    if settings.reconcile:
        policy = reconcile_policy(settings)
        services.append(reconciler_service(public_url(settings), policy, settings.reconcile_interval_s))
    return create_app(
        settings, launchers=build_launchers(settings), services=services, store_factory=build_store
    )
