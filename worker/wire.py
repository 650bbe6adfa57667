"""The JSON wire format between the orchestrator and its workers (and any other API client).

This module is the one piece both sides share. It lives in the worker package because a worker image
carries no server code; the orchestrator imports it, never the other way round. It depends on pydantic
only, so importing it pulls in neither torch nor hivemind.

The API's paths are defined here once (:data:`API_PREFIX`, :class:`ApiPath`): the orchestrator declares
its routes with them and every client calls them. Endpoints that carry these models (all under
``/api/v1``):

==========================================  ================  =======================================
``POST /workers/register``                  join or launch    :class:`WorkerRegister` ->
                                                              :class:`WorkerRegistered`
``POST /workers/{worker_id}/heartbeat``     worker token      :class:`Heartbeat` -> :class:`HeartbeatReply`
``POST /workers/{worker_id}/deregister``    worker token      :class:`Deregister` -> 204
``PUT  /workers/{worker_id}/checkpoints/{epoch}``  worker token  raw bytes, header ``X-Checksum-Sha256``
``GET  /runs/{name}/checkpoints/latest/download``  worker/run/admin token   raw bytes
``GET  /runs/{name}/package``               worker/run/admin token  the run's code package (raw bytes)
``GET  /runs/{name}/peers``                 none              :class:`PeerList`
``POST /workers/{worker_id}/swarm-token``  worker token      :class:`SwarmTokenRequest` -> :class:`SwarmToken`
``GET  /swarm-auth``                        none              :class:`SwarmAuthInfo`
==========================================  ================  =======================================
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from worker.wire_trainer import (
    DEFAULT_REPORT_METRICS,
    MAX_REPORT_PATTERNS,
    MAX_REPORTED_METRICS,
    ImportPath,
    MetricName,
    TrainerSection,
    check_report_patterns,
    pattern_in_words,
    plain_json,
)

RUN_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
RunName = Annotated[
    str,
    Field(pattern=RUN_NAME_PATTERN),
    pattern_in_words(
        RUN_NAME_PATTERN, "use 1 to 63 lowercase letters, digits and hyphens, not starting with a hyphen"
    ),
]

#: The prefix of the JSON API; :class:`ApiPath` templates are relative to it.
API_PREFIX = "/api/v1"


class ApiPath:
    """Route templates of the JSON API, relative to :data:`API_PREFIX`; a client fills one in with
    ``str.format`` (``ApiPath.heartbeat.format(worker_id=7)``)."""

    runs = "/runs"
    run = "/runs/{name}"
    run_scale = "/runs/{name}/scale"
    run_stop = "/runs/{name}/stop"
    run_resume = "/runs/{name}/resume"
    run_join_token = "/runs/{name}/join-token"
    run_revoke_manual = "/runs/{name}/manual-workers/revoke"
    run_events = "/runs/{name}/events"
    run_progress = "/runs/{name}/progress"
    run_workers = "/runs/{name}/workers"
    run_worker_log = "/runs/{name}/workers/{worker_id}/log"
    run_peers = "/runs/{name}/peers"
    run_package = "/runs/{name}/package"
    run_checkpoints = "/runs/{name}/checkpoints"
    run_latest_checkpoint = "/runs/{name}/checkpoints/latest/download"
    run_checkpoint = "/runs/{name}/checkpoints/{epoch}/download"
    run_checkpoint_item = "/runs/{name}/checkpoints/{epoch}"
    package = "/packages/{sha256}"
    peers = "/peers"
    swarm_auth = "/swarm-auth"
    register = "/workers/register"
    heartbeat = "/workers/{worker_id}/heartbeat"
    deregister = "/workers/{worker_id}/deregister"
    swarm_token = "/workers/{worker_id}/swarm-token"
    checkpoint_upload = "/workers/{worker_id}/checkpoints/{epoch}"
    resume_failure = "/workers/{worker_id}/resume-failures"


#: The heartbeat's full route template: the route, its fast path and its request metrics all use it.
HEARTBEAT_ROUTE = API_PREFIX + ApiPath.heartbeat


def path_regex(template: str, **groups: str) -> str:
    """A regex of the full paths of an :class:`ApiPath` template: each ``{param}`` matches one path
    segment, or the pattern ``groups`` gives for it."""
    pattern = re.escape(API_PREFIX + template)
    for name in re.findall(r"\{(\w+)\}", template):
        pattern = pattern.replace(re.escape("{" + name + "}"), groups.get(name, "[^/]+"))
    return f"^{pattern}$"


CHECKSUM_HEADER = "X-Checksum-Sha256"
# Counters are stored as signed 64-bit integers and counts as 32-bit ones: larger values are refused here,
# at the edge, instead of failing in the database (where one bad heartbeat would poison a whole batch).
MAX_INT64 = 2**63 - 1
MAX_INT32 = 2**31 - 1
#: The largest id a path or query takes (ids are 32-bit in the database); larger ones are refused at the edge.
MAX_ID = MAX_INT32
NO_NUL_PATTERN = r"^[^\x00]*$"  # PostgreSQL text cannot hold NUL characters
# Control characters (C0, DEL, C1, line and paragraph separators): in a host name or a message they would
# start forged lines in logs and terminals, so free text that reaches the log refuses them.
CONTROL_CHARACTERS = "\x00-\x1f\x7f-\x9f\u2028\u2029"
CONTROL_CHARACTER_RE = re.compile(f"[{CONTROL_CHARACTERS}]")


def refuse_control_characters(value: str | None) -> str | None:
    """A field validator: ``value`` unchanged, or ValueError naming the first control character."""
    found = CONTROL_CHARACTER_RE.search(value) if value else None
    if found:
        raise ValueError(f"control character {found.group()!r} at position {found.start()} is not allowed")
    return value


def without_control_characters(text: str) -> str:
    """``text`` with each run of control characters replaced by one space (a message fit to send)."""
    return CONTROL_CHARACTER_RE.sub(" ", text).strip()


PlainText = Annotated[str, AfterValidator(refuse_control_characters)]
SHA256_PATTERN = r"^[0-9a-f]{64}$"
# A run's environment variables: names a shell accepts; none the agent or the interpreter reads at start-up
# (setting them once the worker runs would silently do nothing, or change the agent itself).
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
RESERVED_ENV_PREFIXES = ("SPOTSWARM_", "PYTHON", "LD_")
MAX_ENV_VARS = 256
EnvName = Annotated[str, Field(pattern=ENV_NAME_PATTERN)]
EnvValue = Annotated[str, Field(max_length=32768, pattern=NO_NUL_PATTERN)]
RequirementLine = Annotated[
    str, Field(min_length=1, max_length=1000), AfterValidator(refuse_control_characters)
]
REQUEST_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class StrictModel(BaseModel):
    """Base of every request model: unknown fields are an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid")


class RunState(str, Enum):
    """Lifecycle of a run; the allowed transitions live in ``orchestrator/domain/states.py``."""

    pending = "pending"
    running = "running"
    stopping = "stopping"
    stopped = "stopped"
    completed = "completed"
    failed = "failed"

    def __str__(self) -> str:  # the value in messages, on every Python version
        return str(self.value)


class WorkerState(str, Enum):
    """Lifecycle of a worker; the allowed transitions live in ``orchestrator/domain/states.py``."""

    launching = "launching"
    running = "running"
    lost = "lost"
    interrupted = "interrupted"
    exited = "exited"
    failed = "failed"

    def __str__(self) -> str:  # the value in messages, on every Python version
        return str(self.value)


class StopCause(str, Enum):
    """Why a run was asked to stop, or failed (stored on the run): a stopping run whose workers have all
    left ends ``completed`` when the cause is ``target_reached`` (or the swarm reached the target
    meanwhile), else ``stopped`` (``orchestrator/domain/states.py``)."""

    target_reached = "target_reached"  # the reconcile loop saw the stop condition met
    user = "user"  # an admin asked (POST /runs/{name}/stop)
    failed = "failed"  # the run failed (start-up failures, crash budget)

    def __str__(self) -> str:
        return str(self.value)


class StopCondition(StrictModel):
    """When a run is complete: whichever target is reached first. Neither set means run until stopped."""

    target_epochs: int | None = Field(
        default=None, ge=1, le=MAX_INT64, description="Swarm epochs (hivemind global steps)."
    )
    target_samples: int | None = Field(
        default=None, ge=1, le=MAX_INT64, description="Samples accumulated by the swarm."
    )

    def reached(self, epoch: int, target_batch_size: int) -> bool:
        """True once the swarm is at ``target_epochs`` or has accumulated ``target_samples``.

        Both sides judge by the swarm's epoch: its samples are :func:`swarm_samples` of that epoch (what a
        peer accumulated towards an epoch still in progress is not counted, so a run ends at the first
        epoch boundary at or past its target samples, the same on the worker and the orchestrator).
        """
        return (self.target_epochs is not None and epoch >= self.target_epochs) or (
            self.target_samples is not None and swarm_samples(epoch, target_batch_size) >= self.target_samples
        )


def swarm_samples(epoch: int, target_batch_size: int) -> int:
    """Samples a swarm has accumulated after ``epoch`` epochs, counted as whole epochs of the run's
    ``target_batch_size`` (hivemind ends an epoch once the swarm has at least that many)."""
    return epoch * target_batch_size


class RunSpec(StrictModel):
    """What a user asks for: the model, the data, the swarm's batch, the worker count and when to stop."""

    name: RunName = Field(description="Unique run name: lowercase, digits, hyphens.")
    module: ImportPath = Field(description="LightningModule as `package.module:Class`.")
    module_args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the module.")
    datamodule: ImportPath = Field(description="LightningDataModule import path.")
    datamodule_args: dict[str, Any] = Field(default_factory=dict)
    target_batch_size: int = Field(ge=1, le=10**9, description="Samples the swarm accumulates per epoch.")
    batch_size: int = Field(ge=1, le=10**7, description="Per-worker batch size.")
    strategy_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra HivemindStrategy keywords (matchmaking_time, averaging_timeout, ...). sync "
        "chooses how workers train together: diloco (what a run that names none is created with), gradients "
        "or local (with diloco: sync_every_s or "
        "sync_every_steps, outer_lr, outer_momentum); in diloco mode a swarm epoch is one averaging round, "
        "so target_epochs and checkpoint_every_epochs count rounds. The run view shows the mode (sync).",
    )
    min_workers: int = Field(default=1, ge=0, le=10_000)
    max_workers: int = Field(default=8, ge=1, le=10_000)
    desired_workers: int = Field(default=2, ge=0, le=10_000)
    stop: StopCondition = Field(default_factory=StopCondition)
    checkpoint_every_epochs: int = Field(
        default=5, ge=1, le=MAX_INT32, description="Checkpointer uploads every N epochs."
    )
    keep_checkpoints: int = Field(default=3, ge=1, le=1000, description="Checkpoints kept per run.")
    launcher: str = Field(default="local", pattern=r"^[a-z0-9_-]{1,32}$")
    launcher_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Options of the run's launcher: local takes cpus_per_worker (cores of its own for each "
        "worker, refused when desired_workers x N exceed the machine's); ec2 its launch plan.",
    )
    # The run's code and environment (docs/guides/your-code.md).
    workdir: str | None = Field(
        default=None,
        pattern=SHA256_PATTERN,
        description="SHA-256 of the run's code package (`spotswarm runs create --workdir DIR` uploads it to "
        "PUT /packages/{sha256}): every worker imports the module from these very bytes.",
    )
    requirements: list[RequirementLine] = Field(
        default_factory=list,
        max_length=500,
        description="Lines of a requirements file, installed on each worker into the run's environment "
        "(layered on the worker's own); relative paths, like `-r requirements.txt`, are the package's.",
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict, max_length=MAX_ENV_VARS, description="Environment variables of the run's code."
    )
    secret_env: dict[EnvName, EnvValue | None] = Field(
        default_factory=dict,
        max_length=MAX_ENV_VARS,
        description="Environment variables with secret values: given at creation, never returned (reads "
        "show null), handed only to the run's workers when they register.",
    )
    # -- what each worker's Trainer does, and what its workers report (worker/wire_trainer.py) ----------
    trainer: TrainerSection = Field(
        default_factory=TrainerSection,
        description="Options of every worker's Lightning Trainer (precision, clipping, validation, "
        "callbacks, loggers); what a worker cannot honour is refused here.",
    )
    report_metrics: list[MetricName] = Field(
        default_factory=lambda: list(DEFAULT_REPORT_METRICS),
        max_length=MAX_REPORT_PATTERNS,
        description="Metrics workers report (names, or glob patterns like val_*), from what the module "
        "logs; the first 32 matching names by name count.",
    )

    # -- what a worker's failures may cost the run (docs/concepts/runs.md, "Crash budget") -----------------
    max_worker_crashes: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="Launched workers that may fail with the same error after training, within the "
        "server's crash window, before the run fails with that error (null: the server's default).",
    )

    # -- what hand-joined workers are trusted with (docs/security/tokens.md, "Hand-joined workers") -------
    hand_joined_checkpoint: bool = Field(
        default=False,
        description="Hand-joined workers (registered with the join token) may be elected the run's "
        "checkpointer, and then only while no launched worker can be: whoever holds the join token could "
        "otherwise upload the checkpoint every launched worker resumes from.",
    )
    hand_joined_secrets: bool = Field(
        default=True,
        description="Hand-joined workers get the values of secret_env when they register, as launched "
        "workers do (false: they get none, and the run's code must do without them there).",
    )

    _plain_json = field_validator("module_args", "datamodule_args", "strategy_options", "launcher_options")(
        plain_json
    )
    _report_patterns = field_validator("report_metrics")(check_report_patterns)

    @model_validator(mode="after")
    def _clipping_needs_own_buffers(self) -> RunSpec:
        # HivemindStrategy refuses it too, but only once each worker has started (worker/strategy/checks.py)
        if self.trainer.gradient_clip_val and self.strategy_options.get("reuse_grad_buffers"):
            raise ValueError(
                "trainer.gradient_clip_val with strategy_options reuse_grad_buffers=true would clip the sum "
                "of many batches' gradients: drop one of them"
            )
        return self

    @field_validator("env", "secret_env")
    @classmethod
    def _no_reserved_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        reserved = sorted(name for name in value if name.upper().startswith(RESERVED_ENV_PREFIXES))
        if reserved:
            raise ValueError(
                f"{', '.join(reserved)}: names starting with {', '.join(RESERVED_ENV_PREFIXES)} are the "
                "agent's or read by the interpreter at start-up, before the run's variables are set"
            )
        return value

    @model_validator(mode="after")
    def _env_names_once(self) -> RunSpec:
        both = sorted(set(self.env) & set(self.secret_env))
        if both:
            raise ValueError(f"{', '.join(both)}: in both env and secret_env; keep each name in one")
        return self

    def missing_secrets(self) -> list[str]:
        """Names in ``secret_env`` without a value (a spec read back from the API: reads hide values)."""
        return sorted(name for name, value in self.secret_env.items() if value is None)

    def without_secret_values(self) -> RunSpec:
        """This spec with every ``secret_env`` value replaced by None (what reads and logs may show)."""
        return self.model_copy(update={"secret_env": dict.fromkeys(self.secret_env)})

    @model_validator(mode="after")
    def _counts_are_ordered(self) -> RunSpec:
        if self.min_workers > self.max_workers:
            raise ValueError(f"min_workers ({self.min_workers}) > max_workers ({self.max_workers})")
        if not self.min_workers <= self.desired_workers <= self.max_workers:
            raise ValueError(
                f"desired_workers ({self.desired_workers}) must lie in "
                f"[min_workers={self.min_workers}, max_workers={self.max_workers}]"
            )
        return self


#: RunSpec fields that workers before them do not know: a registration reply leaves each out while it
#: holds its default, so an older worker (its RunSpec refuses unknown fields) still joins the runs that
#: do not use them.
NEWER_SPEC_FIELDS = ("trainer", "report_metrics", "max_worker_crashes")
#: RunSpec fields only the orchestrator acts on (what it trusts hand-joined workers with): never sent to
#: workers, which have no use for them (and older ones would refuse them).
SERVER_ONLY_SPEC_FIELDS = ("hand_joined_checkpoint", "hand_joined_secrets")


def spec_for_workers(spec: RunSpec) -> dict[str, Any]:
    """``spec`` as JSON for a registration reply: the :data:`NEWER_SPEC_FIELDS` only where set, the
    :data:`SERVER_ONLY_SPEC_FIELDS` never."""
    unused = {
        name
        for name in NEWER_SPEC_FIELDS
        if getattr(spec, name) == RunSpec.model_fields[name].get_default(call_default_factory=True)
    } | set(SERVER_ONLY_SPEC_FIELDS)
    return spec.model_dump(mode="json", exclude=unused)


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
        "compute: G = (train_s - averaging_s) / averaging_s). Sent only when known: an orchestrator from "
        "before these two fields is sent the counts without them.",
    )
    kept_samples: int = Field(
        default=0,
        ge=0,
        le=MAX_INT64,
        description="DiLoCo: this worker's samples in rounds whose outer step took them with their weight "
        "(averaged, or alone); samples of a discarded round, of a first round at zero weight, or of a round "
        "a worker left unfinished are not kept. 0 in the other modes. Sent only when above 0.",
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
#: counts a worker sends only when above 0, and drops for an orchestrator from before them
AVERAGING_NEWER = (*AVERAGING_TIMES, "kept_samples")


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


# -- swarm admission (docs/concepts/swarm-admission.md) ------------------------------------------

#: ``strategy_options`` key of a run spec: ``false`` lets any peer into the run's swarm (no tokens).
SWARM_ADMISSION_OPTION = "swarm_admission"


def swarm_admission_requested(strategy_options: dict[str, Any]) -> bool:
    """Whether a run's peers must hold swarm tokens: yes unless the spec sets the option to ``false``."""
    return strategy_options.get(SWARM_ADMISSION_OPTION, True) is not False


class SwarmTokenRequest(StrictModel):
    """``POST /workers/{worker_id}/swarm-token`` (worker token): the public key of the worker's peer."""

    public_key: str = Field(
        min_length=64, max_length=2048, description="The peer's RSA public key, OpenSSH format (ssh-rsa ...)."
    )


class SwarmToken(BaseModel):
    """A signed, short-lived right to take part in one run's swarm (a hivemind ``AccessToken``)."""

    username: str = Field(description="`<swarm id>/<subject>`: the run's swarm and who holds the token.")
    public_key: str = Field(description="The holder's public key (its hivemind peer id derives from it).")
    expiration_time: str = Field(description="ISO-8601 UTC time after which peers reject the token.")
    signature: str = Field(description="The orchestrator's signature (base64) over the three fields above.")
    swarm_id: str
    peer_id: str = Field(description="The libp2p peer id of `public_key`.")
    authority_public_key: str = Field(description="The orchestrator's token-signing key, OpenSSH format.")


class SwarmAuthInfo(BaseModel):
    """``GET /swarm-auth``: whether this orchestrator admits peers by token, and the key peers verify with."""

    enabled: bool
    authority_public_key: str | None = None
    token_ttl_s: float | None = None
    open_swarms: list[str] = Field(
        default_factory=list, description="Active runs that opted out: their peers need no token."
    )
