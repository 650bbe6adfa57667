"""What a worker and the orchestrator say to each other while the worker lives: registration, heartbeats,
averaging outcomes, leaving, a failed resume, and the peers to join (paths: :mod:`worker.protocol.paths`).
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from pydantic import BaseModel, Field

from worker.protocol.metrics import MAX_REPORTED_METRICS, MetricName
from worker.protocol.runs import RunSpec
from worker.protocol.validators import MAX_INT32, MAX_INT64, NO_NUL_PATTERN, PlainText, StrictModel, ValueEnum

REQUEST_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class WorkerState(ValueEnum):
    """Lifecycle of a worker; the allowed transitions live in ``orchestrator/domain/states.py``."""

    launching = "launching"
    running = "running"
    lost = "lost"
    interrupted = "interrupted"
    exited = "exited"
    failed = "failed"


class WorkerRegister(StrictModel):
    """Sent by a worker at boot with the run's join token as bearer token."""

    request_id: str | None = Field(
        default=None,
        pattern=REQUEST_ID_PATTERN,
        description="Set by a launcher: binds the worker to its launch row.",
    )
    hostname: PlainText = Field(default="", max_length=255)
    launcher_handle: PlainText | None = Field(default=None, max_length=128, description="PID or instance id.")


class CheckpointRef(BaseModel):
    """A stored checkpoint of a run."""

    epoch: int
    size_bytes: int
    sha256: str
    created_at: str
    download_path: str = Field(description="API path (under the orchestrator URL) to GET the bytes from.")


class WorkerRegistered(BaseModel):
    """The orchestrator's answer to a registration: identity, spec and where the swarm is."""

    worker_id: str
    worker_token: str
    run: RunSpec
    swarm_id: str = Field(description="hivemind run_id (DHT key prefix) for this run.")
    initial_peers: list[str]
    heartbeat_interval_s: float
    resume_checkpoint: CheckpointRef | None = Field(
        default=None, description="Latest checkpoint, to load when no live peer can hand over state."
    )
    older_checkpoints: list[CheckpointRef] = Field(
        default_factory=list,
        description="The run's other checkpoints, newest first: what a worker falls back to when the "
        "resume checkpoint does not load.",
    )
    worker_index: int = Field(
        default=0,
        description="This worker's stable index: the lowest slot free among the run's live workers when it "
        "first registered, kept while it lives (its replacement gets it again).",
    )
    num_workers: int = Field(
        default=1,
        description="The count to shard by when this one registered: the run's desired workers, or its "
        "running ones when more run.",
    )
    secret_env: dict[str, str] = Field(
        default_factory=dict,
        description="Values of the run's secret_env (``run.secret_env`` holds the names only), set in the "
        "worker's environment before the run's code is imported.",
    )


class AveragingCounts(StrictModel):
    """What became of the swarm epochs a worker stepped through, counted since it started
    (``worker/strategy/outcomes.py``): cumulative, so a lost heartbeat loses nothing."""

    averaged: int = Field(default=0, ge=0, le=MAX_INT64, description="Epochs on averaged gradients.")
    alone: int = Field(default=0, ge=0, le=MAX_INT64, description="Local: no other peer in the swarm.")
    no_group: int = Field(default=0, ge=0, le=MAX_INT64, description="Local: no peer joined the round.")
    timeout: int = Field(default=0, ge=0, le=MAX_INT64, description="Local: the round timed out.")
    failed: int = Field(default=0, ge=0, le=MAX_INT64, description="Local: the round failed.")
    downloaded: int = Field(default=0, ge=0, le=MAX_INT64, description="Behind: state downloaded.")
    group_size_sum: int = Field(
        default=0, ge=0, le=MAX_INT64, description="Sum of the averaged rounds' group sizes."
    )
    train_s: float = Field(
        default=0.0, ge=0, allow_inf_nan=False, description="Seconds since the worker started training."
    )
    averaging_s: float = Field(
        default=0.0,
        ge=0,
        allow_inf_nan=False,
        description="Of train_s, the seconds its training thread waited on averaging rounds (the rest is "
        "compute: G = (train_s - averaging_s) / averaging_s); 0 while not known.",
    )
    kept_samples: int = Field(
        default=0,
        ge=0,
        le=MAX_INT64,
        description="DiLoCo: this worker's samples in rounds whose outer step took them with their weight "
        "(averaged, or alone); samples of a discarded round, of a first round at zero weight, or of a round "
        "a worker left unfinished are not kept. 0 in the other modes.",
    )

    @property
    def local(self) -> int:
        return self.alone + self.no_group + self.timeout + self.failed

    @property
    def epochs(self) -> int:
        return self.averaged + self.local + self.downloaded


#: outcome names, as the API and /metrics label them (bounded: these and no others)
AVERAGING_OUTCOMES = ("averaged", "alone", "no_group", "timeout", "failed", "downloaded")
#: the seconds in AveragingCounts (cumulative, like the counts)
AVERAGING_TIMES = ("train_s", "averaging_s")


#: the heartbeat phase of a worker with a spot notice: it trains on, and its replacement is launched now
LEAVING_PHASE = "leaving"


class Heartbeat(StrictModel):
    """Progress a worker reports every few seconds."""

    local_step: int = Field(default=0, ge=0, le=MAX_INT64)
    swarm_epoch: int = Field(default=0, ge=0, le=MAX_INT64)
    samples: int = Field(
        default=0, ge=0, le=MAX_INT64, description="Samples this worker contributed since it started."
    )
    loss: float | None = Field(default=None, allow_inf_nan=False)
    samples_per_s: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    num_peers: int = Field(default=0, ge=0, le=MAX_INT32)
    visible_maddrs: list[Annotated[str, Field(max_length=1024, pattern=NO_NUL_PATTERN)]] = Field(
        default_factory=list, max_length=16
    )
    phase: str = Field(
        default="training",
        pattern=r"^(starting|training|leaving|stopping)$",
        description="leaving: a spot notice came; the worker trains on through most of the notice period, "
        "and the orchestrator launches its replacement now instead of when it is gone.",
    )
    metrics: dict[MetricName, Annotated[float, Field(allow_inf_nan=False)]] = Field(
        default_factory=dict,
        max_length=MAX_REPORTED_METRICS,
        description="Latest values of the run's report_metrics this worker has (e.g. val_loss).",
    )
    averaging: AveragingCounts | None = Field(
        default=None, description="Outcomes of the swarm epochs since the worker started (None: not known)."
    )


class WorkerAction(str, Enum):
    proceed = "continue"
    stop = "stop"


class HeartbeatReply(BaseModel):
    action: WorkerAction = WorkerAction.proceed
    checkpointer: bool = Field(default=False, description="This worker uploads the run's checkpoints.")
    checkpoint_every_epochs: int = 5
    latest_checkpoint_epoch: int | None = None
    num_workers: int | None = Field(
        default=None,
        description="The count to shard by now: the run's desired workers, or its running ones when more "
        "run.",
    )


class DeregisterReason(str, Enum):
    interrupted = "interrupted"  # a spot interruption notice
    stopped = "stopped"  # told to stop (run stopping / scaled down) or SIGTERM
    completed = "completed"  # the run reached its stop condition
    error = "error"  # training failed in the worker


class Deregister(StrictModel):
    reason: DeregisterReason
    message: PlainText | None = Field(default=None, max_length=4000)
    unusable_spec: bool = Field(
        default=False,
        description="With reason error: the run's spec cannot work on any worker (the agent exits with code "
        "3: its code does not build, an option it cannot honour); a launched worker's that has not trained "
        "fails the run at once, with the message, instead of starting the next worker to fail alike.",
    )
    metrics: dict[MetricName, Annotated[float, Field(allow_inf_nan=False)]] = Field(
        default_factory=dict,
        max_length=MAX_REPORTED_METRICS,
        description="The latest values of the run's report_metrics the worker holds as it leaves (e.g. the "
        "val_loss of the validation it ran as it stopped): the run keeps them, also when its last "
        "heartbeat did not carry them.",
    )


class ResumeFailure(StrictModel):
    """Sent by a worker whose resume checkpoint did not load (it falls back to an older one, or none)."""

    epoch: int = Field(ge=0, le=MAX_INT64, description="The epoch of the checkpoint that did not load.")
    message: PlainText = Field(max_length=1000, description="Why it did not load, one line.")


class PeerList(BaseModel):
    """Initial peers: the orchestrator's DHT addresses first, then recent workers' (freshest first)."""

    initial_peers: list[str]
    orchestrator_peers: list[str] = Field(default_factory=list)
    worker_peers: list[str] = Field(default_factory=list)
