"""Request and response models of the REST API (pydantic), apart from the ORM models in ``db/models.py``.

The domain's read views (``domain/views.py``) build the responses and the routes (``api/``) return them:
this module sits below both, so the domain never imports the HTTP edge.

What workers send and receive is in ``worker/protocol/`` (shared with the worker package); this module
holds what only the admin side, the status page and the CLI see. Responses never contain a token hash;
the only secret ever returned is the join token, once, in :class:`RunCreated`. Runs and workers have a
public view (``redacted``) for callers without the admin token.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from worker.protocol.runs import RunSpec, RunState, StopCondition
from worker.protocol.validators import PlainText, StrictModel
from worker.protocol.workers import AveragingCounts, CheckpointRef, WorkerState


class ScaleRequest(StrictModel):
    """New worker counts; ``desired_workers`` must lie in [min, max] (the new ones when given)."""

    desired_workers: int = Field(ge=0, le=10_000)
    min_workers: int | None = Field(default=None, ge=0, le=10_000)
    max_workers: int | None = Field(default=None, ge=1, le=10_000)


class StopRequest(StrictModel):
    reason: PlainText = Field(default="stopped by admin", max_length=1000)


class ResumeRequest(StrictModel):
    stop: StopCondition | None = Field(
        default=None, description="A new stop condition (replaces the old one); a completed run needs one."
    )


class WorkerCounts(BaseModel):
    desired: int
    min: int
    max: int
    live: int = Field(description="Workers launching or running (with a fresh heartbeat).")
    running: int = Field(description="Registered workers whose last heartbeat is fresh.")
    launching: int


class ReportedProgress(BaseModel):
    """Aggregated from worker heartbeats (refreshed about once a second)."""

    swarm_epoch: int = Field(description="Highest swarm epoch any worker reported.")
    samples_total: int = Field(description="Samples contributed by all workers of the run, ever.")
    loss: float | None = Field(
        description="Mean of the latest losses of running workers; of a finished run, the last ones."
    )
    samples_per_s: float = Field(description="Sum over running workers.")
    metrics: dict[str, float] = Field(
        default_factory=dict,
        description="The run's report_metrics (e.g. val_loss), each the mean over the running workers "
        "that report it; of a finished run, the last values.",
    )


class SwarmProgress(BaseModel):
    """Read from the DHT key hivemind's ProgressTracker publishes (``<swarm_id>_progress``)."""

    epoch: int
    samples_accumulated: int = Field(description="Samples towards the next epoch (current epoch only).")
    num_peers: int
    num_clients: int
    samples_per_s: float
    target_batch_size: int
    read_at: datetime


class RunAveraging(BaseModel):
    """Whether the run's workers train one model: their averaging outcomes over the recent window
    (``averaging_window_s``), judged when the run's progress is sampled."""

    window_s: float
    covered: bool = Field(description="The samples span the whole window (the warning needs that).")
    epochs: int = Field(description="Worker-epochs in the window: each worker's epochs, summed.")
    outcomes: dict[str, int] = Field(
        description="Worker-epochs by outcome: averaged, alone, no_group, timeout, failed, downloaded."
    )
    averaged_fraction: float | None = Field(description="averaged / epochs (null without epochs).")
    mean_group_size: float | None = Field(description="Peers per averaged round, on average.")
    samples_per_epoch: float | None = Field(
        default=None,
        description="Samples the workers contributed per swarm epoch in the window (null without a whole "
        "epoch in it).",
    )
    batch_ratio: float | None = Field(
        default=None,
        description="samples_per_epoch / target_batch_size: 1.0 is the swarm batch asked for.",
    )
    train_s: float | None = Field(
        default=None, description="Worker-seconds of training in the window, summed over the workers."
    )
    averaging_s: float | None = Field(
        default=None, description="Of train_s, the seconds the workers' training waited on averaging rounds."
    )
    waiting_share: float | None = Field(
        default=None,
        description="averaging_s / train_s: the share of wall time workers wait on averaging (null before "
        "workers report their seconds).",
    )
    g: float | None = Field(
        default=None,
        description="G: compute per averaging round over the round's cost, (train_s - averaging_s) / "
        "averaging_s (null without waiting). More workers pay off as G grows (1.33x for 2 at G = 1, 1.83x "
        "at G = 10).",
    )
    live_workers: int
    warning: str | None = Field(
        description="Set while the averaged fraction stays below the threshold, or within seconds while 2+ "
        "live workers train apart before any of them averaged (swarm_formed false)."
    )
    swarm_formed: bool | None = Field(
        default=None,
        description="False while 2+ live workers have each trained averaging_apart_epochs epochs alone and "
        "none has averaged; true once one has; null before either was seen.",
    )
    at: datetime


class RunOut(BaseModel):
    """A run as the API shows it: its spec, lifecycle and live numbers."""

    name: str
    swarm_id: str
    spec: RunSpec
    sync: str = Field(
        default="gradients",
        description="How the run's workers train together (strategy_options' sync: gradients, local or "
        "diloco). In diloco mode a swarm epoch is one averaging round: reported.swarm_epoch counts rounds.",
    )
    state: RunState
    state_reason: str
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    workers: WorkerCounts
    reported: ReportedProgress
    swarm: SwarmProgress | None = Field(description="Null until the DHT has been read for this run.")
    checkpointer_worker_id: str | None
    latest_checkpoint: CheckpointRef | None
    averaging: RunAveraging | None = Field(
        default=None, description="Null until the run's workers reported averaging outcomes."
    )
    cost_usd: float | None = Field(
        default=None,
        description="Cost so far in USD: over the run's workers whose launch_details carry a price "
        "(price_usd_per_hour, else price_per_hour), that price times the hours from registration (or "
        "launch) to the end (or now). Null when no worker has a price (e.g. the local launcher).",
    )
    eta_s: float | None = Field(
        default=None,
        description="Seconds until the stop condition at the current samples/s: with target_samples, "
        "target_samples - samples_total; with target_epochs, (target_epochs - the highest of reported and "
        "DHT swarm epoch) x target_batch_size - the samples already in the current epoch; with both, the "
        "sooner. Null when the run has no stop condition, is not moving, or has finished.",
    )
    redacted: bool = Field(
        description="True in the public view (no admin token): the spec's free-form values "
        "(module_args, datamodule_args, strategy_options, launcher_options, env, secret_env, requirements, "
        "and the args of trainer callbacks and loggers) are left out, shown empty. The admin view shows "
        "secret_env's names with null values."
    )


class RunCreated(RunOut):
    join_token: str = Field(description="Bearer token workers register with. Shown only this once.")


class RevokedWorkers(BaseModel):
    """The workers joined by hand that ``POST /runs/{name}/manual-workers/revoke`` ended."""

    name: str
    revoked: list[str] = Field(description="Ids of the workers ended; their worker tokens no longer work.")


class JoinToken(BaseModel):
    """A run's new join token (``POST /runs/{name}/join-token``); the old one no longer works."""

    name: str
    join_token: str = Field(description="Bearer token workers register with. Shown only this once.")


class RunList(BaseModel):
    items: list[RunOut]
    total: int
    limit: int
    offset: int


class EventOut(BaseModel):
    id: int
    at: datetime
    kind: str
    message: str
    worker_id: str | None


class EventPage(BaseModel):
    items: list[EventOut]
    next_after_id: int = Field(description="Pass as ?after_id= to get newer events.")


class ProgressPoint(BaseModel):
    at: datetime
    swarm_epoch: int
    samples_total: int
    loss: float | None
    samples_per_s: float
    live_workers: int = Field(description="Workers running with a fresh heartbeat at that moment.")
    desired_workers: int = Field(
        description="The run's desired worker count at that moment (from its scale events)."
    )
    dht_epoch: int | None
    dht_samples: int | None
    dht_peers: int | None
    metrics: dict[str, float] = Field(
        default_factory=dict, description="The run's reported metrics at that moment (empty before any)."
    )
    averaging: dict[str, int | float] | None = Field(
        default=None,
        description="The run's averaging outcome counts (and train_s, averaging_s seconds), summed over its "
        "workers, at that moment: the difference between two points tells which epochs between them were "
        "averaged or local, and how much of their time the workers waited on averaging. Null until a "
        "worker reported counts (none kept, none averaged).",
    )


class ChurnMark(BaseModel):
    at: datetime = Field(description="When the worker left or was found lost.")
    kind: Literal["notice", "loss"] = Field(
        description="notice: the worker left after a spot interruption notice (its replacement could start "
        "before it went); loss: the worker was lost without leaving (no heartbeat, its process or instance "
        "gone, killed without notice)."
    )
    worker_id: str | None
    reason: str = Field(description="The reason of its state change, as its event says.")


class Goodput(BaseModel):
    value: float = Field(
        description="Training progress over the last hour (swarm epochs completed x target_batch_size) "
        "divided by what a steady swarm of the workers the run held would have made: live worker-seconds "
        "x the best samples per worker-second the run kept up in that hour while its live worker count "
        "stood still (measured from one epoch boundary to another). 1 means churn cost nothing; progress "
        "comes in whole epochs, so it can read a little above 1."
    )
    window_s: float = Field(description="Seconds of samples measured (at most an hour, up to the latest).")
    progress_samples: int = Field(
        description="Samples of progress in completed swarm epochs over the window."
    )
    worker_s: float = Field(description="Live worker-seconds the run held over the window.")
    steady_samples_per_worker_s: float = Field(
        description="The steady per-worker rate goodput compares with."
    )


class ProgressSeries(BaseModel):
    points: list[ProgressPoint]
    stored_points: int = Field(description="Samples stored for the run before downsampling.")
    marks: list[ChurnMark] = Field(
        default_factory=list, description="Workers that left after a spot notice or were lost, oldest first."
    )
    goodput: Goodput | None = Field(
        default=None,
        description="Goodput over the last hour; null until the run has a stretch of at least two epochs "
        "with a steady live worker count.",
    )


class WorkerOut(BaseModel):
    id: str
    run: str
    request_id: str
    launcher: str
    launcher_handle: str | None
    manual: bool
    state: WorkerState
    state_reason: str
    retire_requested_at: datetime | None
    hostname: str
    peer_maddrs: list[str]
    launch_details: dict[str, object]
    exit_reason: str | None
    worker_index: int | None = Field(
        default=None,
        description="Its slot among the run's live workers (SPOTSWARM_WORKER_INDEX); null until registered.",
    )
    created_at: datetime
    registered_at: datetime | None
    last_heartbeat_at: datetime | None
    ended_at: datetime | None
    local_step: int
    swarm_epoch: int
    samples: int
    loss: float | None
    samples_per_s: float
    num_peers: int
    phase: str
    metrics: dict[str, float] = Field(
        default_factory=dict, description="Latest values of the run's report_metrics from this worker."
    )
    averaging: AveragingCounts | None = Field(
        default=None, description="Outcomes of the swarm epochs it stepped through since it started."
    )
    averaged_fraction: float | None = Field(
        default=None, description="Its epochs on averaged gradients since it started (null before any)."
    )
    checkpointer: bool
    cost_usd: float | None = Field(
        default=None,
        description="Its cost so far in USD: its price per hour (launch_details price_usd_per_hour, else "
        "price_per_hour) times the hours from registration (or launch) to the end (or now); null without "
        "a price.",
    )
    redacted: bool = Field(
        description="True in the public view (no admin token): launch_details keeps only what describes "
        "the machine and its price, not where it is (IPs, subnets, paths)."
    )


class WorkerList(BaseModel):
    items: list[WorkerOut]
    total: int
    limit: int
    offset: int


class PackageRef(BaseModel):
    """A stored code package (``PUT /packages/{sha256}``); a run names it by ``sha256`` (spec ``workdir``)."""

    sha256: str
    size_bytes: int


class CheckpointList(BaseModel):
    items: list[CheckpointRef] = Field(description="Newest epoch first.")


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str
    database: bool
    dht: bool
    detail: dict[str, str] = Field(default_factory=dict)


class ErrorOut(BaseModel):
    """Body of every 4xx/5xx answer."""

    detail: str | list[dict[str, object]]
