"""``ec2``: workers on EC2 spot instances, one instant EC2 Fleet per instance.

How a launch goes (see :mod:`orchestrator.launchers.ec2.fleet` for the request itself):

1. The run's ``launcher_options`` are merged over the launcher's defaults and checked
   (:class:`LauncherConfigError` when they can never work).
2. Idempotency: an instance already tagged with the request id (this orchestrator's) is the answer.
   Otherwise one ``CreateFleet`` (type ``instant``) asks for one spot instance over every
   (instance type, subnet) pool of the run, with the worker's user data and a per-attempt client token.
3. No capacity anywhere: the failure is queued for :meth:`Ec2Launcher.poll_errors` (retryable, and a
   capacity failure when every pool said so: the run waits for capacity, it does not fail), and after
   ``on_demand_fallback_after`` consecutive spot failures of the run the same call tries on-demand.

An instance with several GPUs runs one peer per GPU (``peers_per_machine``: :mod:`.gpus`): the
request's siblings travel in the same user data, each with its own request id, join token and DHT port
(``31331 + gpu``), and are tagged ``spotswarm:peer-<gpu>``. :meth:`Ec2Launcher.describe` lists each peer
under its own request id, and :meth:`Ec2Launcher.terminate` of one peer terminates the instance once
every peer of it was terminated (a container cannot be stopped from here; a retired peer's agent leaves
and its container exits by itself, its GPU idle until the instance ends).

Every instance carries ``spotswarm:orchestrator``, ``spotswarm:run``, ``spotswarm:request-id`` and
``Name``; :meth:`Ec2Launcher.describe` finds them by the first two tags, so a restarted orchestrator
adopts its workers, and its reconcile loop ends the ones no worker row knows. An instance
without a request id was not launched by this launcher (the orchestrator's own machine, or one made by
hand): it is never listed, so never terminated. The Terraform module's IAM policy says the same.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from orchestrator.launchers.base import (
    MACHINE_DETAIL,
    PEER_INDEX_DETAIL,
    Instance,
    LauncherConfigError,
    LaunchFailure,
    LaunchRequest,
)
from orchestrator.launchers.ec2.fleet import (
    TAG_ORCHESTRATOR,
    TAG_REQUEST,
    TAG_RUN,
    ErrorKind,
    LaunchPlan,
    Market,
    build_fleet_request,
    classify,
    client_token,
    instance_tags,
    launched_instance_ids,
    peer_request_ids,
    pool_errors,
    resolve_plan,
)
from orchestrator.launchers.ec2.pricing import SpotPriceCache
from orchestrator.launchers.ec2.settings import Ec2Settings
from orchestrator.launchers.ec2.userdata import DEFAULT_WORKER_TEMPLATE, machine_env, render_worker_user_data

log = logging.getLogger(__name__)

ALIVE_STATES = frozenset({"pending", "running"})
GONE_STATES = frozenset({"shutting-down", "terminated"})
SPOT_INTERRUPTION_REASON = "Server.SpotInstanceTermination"
_ORCHESTRATOR_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
# DescribeInstances may lag a launch by some seconds: trust our own record of it that long.
LAUNCH_VISIBILITY_LAG_S = 120.0
# The Terraform module's worker security group opens this port between peers, and the next ones: the
# peer on GPU i of an instance listens on WORKER_DHT_PORT + i.
WORKER_DHT_PORT = 31331
SPOT_PRICE_TTL_S = 300.0  # spot prices are read again after this long
# Added to every worker's environment, under the request's own variables.
DEFAULT_WORKER_ENV: Mapping[str, str] = {
    "SPOTSWARM_METADATA_URL": "http://169.254.169.254",  # turns on the agent's spot watcher
    "SPOTSWARM_HOST_MADDRS": f"/ip4/0.0.0.0/tcp/{WORKER_DHT_PORT}",
}


def make_ec2_client(region: str | None, endpoint_url: str | None = None) -> Any:
    """A boto3 EC2 client with the default credential chain, bounded timeouts and standard retries."""
    config = Config(retries={"mode": "standard", "max_attempts": 5}, connect_timeout=5, read_timeout=30)
    return boto3.client("ec2", region_name=region, endpoint_url=endpoint_url, config=config)


@dataclass(frozen=True)
class _Attempt:
    instance_id: str | None
    reason: str = ""
    capacity: bool = False  # nothing launched because no pool had capacity (or quota) for it


class Ec2Launcher:
    """:class:`~orchestrator.launchers.base.Launcher` on EC2 spot. Thread-safe; calls are serialized."""

    name = "ec2"

    def __init__(
        self,
        settings: Ec2Settings,
        client: Any | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``settings.orchestrator_id`` is the value of the ``spotswarm:orchestrator`` tag: the IAM policy
        made by the Terraform module lets the orchestrator launch and terminate only instances carrying
        it. Raises :class:`LauncherConfigError` without a launch template or with an unusable id."""
        if not settings.launch_template:
            raise LauncherConfigError(
                "the ec2 launcher needs a launch template (SPOTSWARM_EC2_LAUNCH_TEMPLATE)"
            )
        if not _ORCHESTRATOR_ID.match(settings.orchestrator_id):
            raise LauncherConfigError(f"orchestrator_id {settings.orchestrator_id!r}: 1-64 of [A-Za-z0-9._-]")
        self.settings = settings
        self._default_plan = LaunchPlan(
            instance_types=tuple(settings.instance_types),
            subnet_ids=tuple(settings.subnet_ids),
            launch_template=settings.launch_template,
            max_price=settings.max_price,
            on_demand_fallback_after=settings.on_demand_fallback_after,
            gpus=True,  # a run's options may turn them off (CPU instance types)
            worker_image=settings.worker_image,
        )
        self._user_data_template = settings.user_data_template or DEFAULT_WORKER_TEMPLATE
        self._owns_client = client is None
        self._client = (
            client if client is not None else make_ec2_client(settings.region, settings.endpoint_url)
        )
        self._clock = clock
        self._prices = SpotPriceCache(self._client, SPOT_PRICE_TTL_S, clock)
        self._lock = threading.Lock()
        self._failures: list[LaunchFailure] = []
        self._attempts: dict[str, int] = {}
        self._spot_failures: dict[str, int] = {}  # consecutive, by run name
        self._launched: dict[str, tuple[str, float]] = {}  # request id -> (instance id, when), this process
        self._ended_peers: dict[str, set[str]] = {}  # instance id -> its peers terminate() was called for

    def validate_options(self, options: Mapping[str, Any], *, workers: int = 1) -> None:
        """Raise :class:`LauncherConfigError` unless ``options`` merge into a valid launch plan (the number
        of workers does not matter here: more take more instances)."""
        resolve_plan(options, self._default_plan)

    def peers_per_machine(self, options: Mapping[str, Any]) -> int:
        """``peers_per_machine`` of the run, else one per GPU of its smallest instance type (:mod:`.gpus`)."""
        return resolve_plan(options, self._default_plan).peers_per_machine

    def launch(self, request: LaunchRequest) -> str:
        """Start one instance for ``request`` and return its id; ``""`` when EC2 had no capacity.

        Idempotent by request id: while an instance of the request is not gone, that one is returned
        (a relaunch of the same request after its instance ended starts a new one). Raises
        LauncherConfigError for options or AWS answers that say the request can never succeed as
        given; capacity failures go to :meth:`poll_errors`.
        """
        plan = resolve_plan(request.options, self._default_plan)
        if len(request.peers) > plan.peers_per_machine:
            raise LauncherConfigError(
                f"{len(request.peers)} peers on one instance; the run's take {plan.peers_per_machine}"
            )
        env = machine_env([
            {**DEFAULT_WORKER_ENV, **peer.env, "SPOTSWARM_REQUEST_ID": peer.request_id,
             "SPOTSWARM_HOST_MADDRS": f"/ip4/0.0.0.0/tcp/{WORKER_DHT_PORT + gpu}"}
            for gpu, peer in enumerate(request.peers)
        ])  # fmt: skip
        user_data = render_worker_user_data(
            self._user_data_template, worker_image=plan.worker_image, env=env, gpus=plan.gpus
        )
        with self._lock:
            existing = self._recently_launched(request.request_id) or self._existing_instance(
                request.request_id
            )
            if existing:
                log.info(
                    "run %s request %s: already launched as %s",
                    request.run_name,
                    request.request_id,
                    existing,
                )
                return existing
            instance_id = self._launch_with_fallback(request, plan, user_data)
            if instance_id:
                self._launched[request.request_id] = (instance_id, self._clock())
            return instance_id

    def _launch_with_fallback(self, request: LaunchRequest, plan: LaunchPlan, user_data: str) -> str:
        run = request.run_name
        threshold = plan.on_demand_fallback_after
        reasons, capacity = [], True
        if threshold != 0:
            spot = self._create_one(request, plan, Market.spot, user_data)
            if spot.instance_id:
                self._spot_failures[run] = 0
                return spot.instance_id
            self._spot_failures[run] = self._spot_failures.get(run, 0) + 1
            reasons.append(spot.reason)
            capacity = capacity and spot.capacity
        if threshold is not None and self._spot_failures.get(run, 0) >= threshold:
            log.warning("run %s request %s: trying on-demand (%d spot failures in a row)",
                        run, request.request_id, self._spot_failures.get(run, 0))  # fmt: skip
            on_demand = self._create_one(request, plan, Market.on_demand, user_data)
            if on_demand.instance_id:
                return on_demand.instance_id
            reasons.append(on_demand.reason)
            capacity = capacity and on_demand.capacity
        failure = LaunchFailure(
            request.request_id, run, "; ".join(reasons), retryable=True, capacity=capacity
        )
        log.warning("run %s request %s: launch failed: %s", run, request.request_id, failure.reason)
        self._failures.append(failure)
        return ""

    def _create_one(
        self, request: LaunchRequest, plan: LaunchPlan, market: Market, user_data: str
    ) -> _Attempt:
        attempt = self._attempts.get(request.request_id, 0) + 1
        self._attempts[request.request_id] = attempt
        siblings = [peer.request_id for peer in request.siblings]
        tags = instance_tags(
            self.settings.orchestrator_id, request.run_name, request.request_id, market, siblings
        )
        token = client_token(self.settings.orchestrator_id, request.request_id, attempt)
        kwargs = build_fleet_request(plan, market, tags, user_data, token)
        try:
            response = self._client.create_fleet(**kwargs)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code, message = str(error.get("Code", "Unknown")), str(error.get("Message", ""))
            if classify(code) is ErrorKind.config:
                raise LauncherConfigError(
                    f"EC2 refused the {market.value} launch: {code}: {message}"
                ) from exc
            capacity = classify(code) is ErrorKind.capacity
            return _Attempt(None, f"{market.value}: {code}: {message}", capacity)
        ids = launched_instance_ids(response)
        errors = pool_errors(response)
        if ids:
            if errors:
                log.info("run %s request %s: pools skipped: %s", request.run_name, request.request_id,
                         ", ".join(e.describe() for e in errors))  # fmt: skip
            log.info(
                "run %s request %s: launched %s %s",
                request.run_name,
                request.request_id,
                market.value,
                ids[0],
            )
            return _Attempt(ids[0])
        if errors and all(classify(e.code) is ErrorKind.config for e in errors):
            detail = "; ".join(f"{e.describe()} ({e.message})" for e in errors)
            raise LauncherConfigError(f"EC2 refused every pool of the {market.value} launch: {detail}")
        summary = ", ".join(e.describe() for e in errors) or "nothing launched, no error given"
        capacity = bool(errors) and all(classify(e.code) is ErrorKind.capacity for e in errors)
        return _Attempt(None, f"no {market.value} capacity ({summary})", capacity)

    def terminate(self, request_id: str) -> None:
        """Terminate the instance of ``request_id`` once no peer of it is left: at once for an instance of
        one peer, else when terminate was called for each of its peers. A no-op when none lives; AWS errors
        are logged."""
        ids = []
        # The first peer's instance is found by its tag; another peer's by a look at every instance.
        for instance in [*self._instances(request_id)] or [*self._instances()]:
            if instance.request_id != request_id or instance.details.get("state") in GONE_STATES:
                continue
            peers = set(instance.details.get("peers", [request_id]))
            with self._lock:
                ended = self._ended_peers.setdefault(instance.handle, set())
                ended.add(request_id)
                if ended < peers:
                    log.info("peer %s of %s ended; its %d other peer(s) keep the instance",
                             request_id, instance.handle, len(peers - ended))  # fmt: skip
                    continue
                self._ended_peers.pop(instance.handle, None)
                for peer in peers:
                    self._launched.pop(peer, None)
            ids.append(instance.handle)
        self._terminate_ids(ids, f"request {request_id}")

    def describe(self) -> list[Instance]:
        """Every instance tagged by this orchestrator that EC2 still lists (terminated ones for ~1 h)."""
        return list(self._instances())

    def poll_errors(self) -> list[LaunchFailure]:
        """Launch failures since the last call, each once."""
        with self._lock:
            failures, self._failures = self._failures, []
        return failures

    def close(self) -> None:
        """Close the client if this launcher made it; instances keep running."""
        if self._owns_client:
            self._client.close()

    def _recently_launched(self, request_id: str) -> str | None:
        entry = self._launched.get(request_id)
        if entry and self._clock() - entry[1] < LAUNCH_VISIBILITY_LAG_S:
            return entry[0]
        return None

    def _existing_instance(self, request_id: str) -> str | None:
        found = [
            i
            for i in self._instances(request_id)
            if i.request_id == request_id and i.details.get("state") not in GONE_STATES
        ]
        return found[0].handle if found else None

    def _terminate_ids(self, ids: list[str], what: str) -> None:
        if not ids:
            return
        try:
            self._client.terminate_instances(InstanceIds=ids)
        except ClientError as exc:
            log.error("terminating %s (%s) failed; the next tick tries again: %s", what, ids, exc)
            return
        log.info("terminated %s: %s", what, ids)

    def _instances(self, request_id: str | None = None) -> Iterator[Instance]:
        """This orchestrator's workers, one per peer (of the instance launched for ``request_id``): its
        tag *and* a request id, never less."""
        filters = [
            {"Name": f"tag:{TAG_ORCHESTRATOR}", "Values": [self.settings.orchestrator_id]},
            {"Name": f"tag:{TAG_REQUEST}", "Values": [request_id]}
            if request_id is not None
            else {"Name": "tag-key", "Values": [TAG_REQUEST]},
        ]
        paginator = self._client.get_paginator("describe_instances")
        for page in paginator.paginate(Filters=filters):
            for reservation in page.get("Reservations", []):
                for raw in reservation.get("Instances", []):
                    if any(t["Key"] == TAG_REQUEST and t["Value"] for t in raw.get("Tags", [])):
                        yield from self._peers(self._to_instance(raw), raw)

    def _peers(self, instance: Instance, raw: dict[str, Any]) -> Iterator[Instance]:
        """The instance once per peer: alone, as it is; with siblings, each under its own request id with
        its share of the price (so that a run's cost adds up to the instance's)."""
        peers = peer_request_ids({t["Key"]: t["Value"] for t in raw.get("Tags", [])})
        if len(peers) == 1:
            yield instance
            return
        price = instance.details.get("price_usd_per_hour")
        share = {"price_usd_per_hour": price / len(peers) if price is not None else None, "peers": peers}
        for gpu, request_id in enumerate(peers):
            details = {**instance.details, **share, MACHINE_DETAIL: peers[0], PEER_INDEX_DETAIL: gpu}
            yield Instance(request_id, instance.handle, instance.run_name, instance.alive, details)

    def _to_instance(self, raw: dict[str, Any]) -> Instance:
        tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
        state = raw.get("State", {}).get("Name", "unknown")
        zone = raw.get("Placement", {}).get("AvailabilityZone", "")
        market = "spot" if raw.get("InstanceLifecycle") == "spot" else "on-demand"
        reason = raw.get("StateReason", {}).get("Code", "")
        price = None
        if market == "spot" and state not in GONE_STATES and zone:
            price = self._prices.price(raw["InstanceType"], zone)
        launch_time = raw.get("LaunchTime")
        details = {
            "instance_type": raw.get("InstanceType"),
            "availability_zone": zone,
            "subnet_id": raw.get("SubnetId"),
            "market": market,
            "state": state,
            "state_reason": reason,
            "interrupted": reason == SPOT_INTERRUPTION_REASON,
            "launch_time": launch_time.isoformat() if launch_time else None,
            "private_ip": raw.get("PrivateIpAddress"),
            "public_ip": raw.get("PublicIpAddress"),
            "price_usd_per_hour": price,
        }
        return Instance(
            request_id=tags[TAG_REQUEST],
            handle=raw["InstanceId"],
            run_name=tags.get(TAG_RUN, ""),
            alive=state in ALIVE_STATES,
            details=details,
        )
