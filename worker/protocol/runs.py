"""A run as the API takes it (:class:`RunSpec`), its states, its stop condition, and what of it workers get.

Pydantic only, so importing it pulls in neither torch nor hivemind. What each worker's Trainer does and
what its workers report are :mod:`worker.protocol.trainer` and :mod:`worker.protocol.metrics`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field, field_validator, model_validator

from worker.protocol.metrics import (
    DEFAULT_REPORT_METRICS,
    MAX_REPORT_PATTERNS,
    MetricName,
    check_report_patterns,
)
from worker.protocol.trainer import TrainerSection
from worker.protocol.validators import (
    MAX_INT32,
    MAX_INT64,
    NO_NUL_PATTERN,
    SHA256_PATTERN,
    ImportPath,
    StrictModel,
    ValueEnum,
    pattern_in_words,
    plain_json,
    refuse_control_characters,
)

RUN_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
RunName = Annotated[
    str,
    Field(pattern=RUN_NAME_PATTERN),
    pattern_in_words(
        RUN_NAME_PATTERN, "use 1 to 63 lowercase letters, digits and hyphens, not starting with a hyphen"
    ),
]

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


class RunState(ValueEnum):
    """Lifecycle of a run; the allowed transitions live in ``orchestrator/domain/states.py``."""

    pending = "pending"
    running = "running"
    stopping = "stopping"
    stopped = "stopped"
    completed = "completed"
    failed = "failed"


class StopCause(ValueEnum):
    """Why a run was asked to stop, or failed (stored on the run): a stopping run whose workers have all
    left ends ``completed`` when the cause is ``target_reached`` (or the swarm reached the target
    meanwhile), else ``stopped`` (``orchestrator/domain/states.py``)."""

    target_reached = "target_reached"  # the reconcile loop saw the stop condition met
    user = "user"  # an admin asked (POST /runs/{name}/stop)
    failed = "failed"  # the run failed (start-up failures, crash budget)


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
    # -- what each worker's Trainer does, and what its workers report (trainer.py, metrics.py) -------
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


#: RunSpec fields only the orchestrator acts on (what it trusts hand-joined workers with): never sent to
#: workers, which have no use for them.
SERVER_ONLY_SPEC_FIELDS = ("hand_joined_checkpoint", "hand_joined_secrets")


def spec_for_workers(spec: RunSpec) -> dict[str, Any]:
    """``spec`` as JSON for a registration reply: without the :data:`SERVER_ONLY_SPEC_FIELDS`."""
    return spec.model_dump(mode="json", exclude=set(SERVER_ONLY_SPEC_FIELDS))


# -- swarm admission (docs/concepts/swarm-admission.md) ------------------------------------------

#: ``strategy_options`` key of a run spec: ``false`` lets any peer into the run's swarm (no tokens).
SWARM_ADMISSION_OPTION = "swarm_admission"


def swarm_admission_requested(strategy_options: dict[str, Any]) -> bool:
    """Whether a run's peers must hold swarm tokens: yes unless the spec sets the option to ``false``."""
    return strategy_options.get(SWARM_ADMISSION_OPTION, True) is not False
