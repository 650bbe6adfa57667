"""The wire format of a run's ``trainer`` section and of the metrics its workers report: the part of
the wire format (:mod:`worker.wire` builds ``RunSpec`` and ``Heartbeat`` from it) about training options.

The ``trainer`` section is what a run may set on each worker's Lightning ``Trainer``: only options the
agent can apply and ``HivemindStrategy`` can honour. Everything else is refused when the run is created,
with the reason (see :data:`RESERVED_TRAINER_KEYS`), instead of failing on every worker after launch.

``report_metrics`` names the metrics (names or shell-style glob patterns) that workers report in their
heartbeats. Everything is bounded, because metric names become label values of the orchestrator's
``/metrics`` series and keys of stored JSON: a run names at most :data:`MAX_REPORT_PATTERNS` patterns and
a worker reports at most :data:`MAX_REPORTED_METRICS` values. Depends on pydantic only.
"""

from __future__ import annotations

import difflib
import json
import re
from datetime import timedelta
from fnmatch import fnmatchcase
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

IMPORT_PATH_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$"


def pattern_in_words(pattern: str, hint: str) -> BeforeValidator:
    """A validator that refuses a string not matching ``pattern`` with ``hint`` and the value, in words.

    Put it after ``Field(pattern=pattern)`` in an ``Annotated`` type: it runs first, so a client reads
    "use package.module:ClassName (got 'x')" instead of a regular expression; the schema keeps the pattern.
    """
    compiled = re.compile(pattern)

    def check(value: Any) -> Any:
        if isinstance(value, str) and not compiled.match(value):
            raise PydanticCustomError(
                "string_pattern_mismatch", f"{hint} (got {{got}})", {"got": repr(value[:100])}
            )
        return value

    return BeforeValidator(check)


ImportPath = Annotated[
    str,
    Field(pattern=IMPORT_PATH_PATTERN),
    pattern_in_words(
        IMPORT_PATH_PATTERN, "use package.module:ClassName, e.g. worker.examples.digits:DigitsModule"
    ),
]

#: Precisions ``HivemindStrategy`` trains with: fp32, bf16 autocast, and fp16 autocast with hivemind's
#: gradient scaler (``worker/strategy/precision.py``). On a CPU, Lightning runs "16-mixed" as bf16.
TRAINER_PRECISIONS = ("32-true", "16-mixed", "bf16-mixed")
MAX_TRAINER_PLUGINS = 16  # callbacks, and loggers, per run
MAX_REPORT_PATTERNS = 16  # entries of report_metrics
MAX_REPORTED_METRICS = 32  # values in one heartbeat, and kept per worker and per run
MAX_METRIC_NAME_CHARS = 100
#: How often a worker validates, in seconds of its training, when the run's ``trainer`` section sets no
#: cadence (``val_check_interval`` left out, ``check_val_every_n_epoch`` at 1): Lightning's own default,
#: the end of each local pass over the data, can be many minutes away on a real data set, and a run
#: whose first ``val_loss`` comes that late looks broken. A worker also validates as it stops.
DEFAULT_VAL_CHECK_INTERVAL_S = 60.0
#: What workers report when a run does not say: the training loss under its usual names, and every
#: metric whose name starts with ``val_`` (what ``self.log("val_...")`` in ``validation_step`` gives).
DEFAULT_REPORT_METRICS = ("train_loss", "loss", "train/loss", "val_*")
#: Names of the training loss, in the order a worker looks for it (the heartbeat's ``loss``).
LOSS_METRIC_NAMES = ("train_loss", "loss", "train/loss")

# Printable text without control characters or spaces at either end: a metric name (or pattern) is a
# label value in /metrics and a column in the CLI.
_NAME_RE = re.compile(r"^[^\s\x00-\x1f\x7f-\x9f](?:[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f])?$")


def is_metric_name(name: str) -> bool:
    """Whether ``name`` may be a metric name (or pattern): see :data:`MetricName`."""
    return len(name) <= MAX_METRIC_NAME_CHARS and _NAME_RE.match(name) is not None


def _metric_name(name: str) -> str:
    if not is_metric_name(name):
        raise ValueError(
            f"a metric name is 1 to {MAX_METRIC_NAME_CHARS} printable characters, "
            "without spaces at either end"
        )
    return name


MetricName = Annotated[str, AfterValidator(_metric_name)]

#: Trainer keywords a run cannot set, and why: the agent or the strategy owns them.
RESERVED_TRAINER_KEYS: dict[str, str] = {
    "accumulate_grad_batches": "HivemindStrategy accumulates gradients itself up to target_batch_size: "
    "raise target_batch_size instead",
    "strategy": "every worker trains with HivemindStrategy (its keywords go in strategy_options)",
    "devices": "a worker trains on one device: start one worker per device",
    "num_nodes": "a worker is one process on one device: start one worker per device",
    "accelerator": "it is set per worker (spotswarm-worker --accelerator, SPOTSWARM_ACCELERATOR)",
    "max_epochs": "the run's stop condition (stop.target_epochs, stop.target_samples) ends training",
    "max_steps": "the run's stop condition (stop.target_epochs, stop.target_samples) ends training",
    "max_time": "the run's stop condition (stop.target_epochs, stop.target_samples) ends training",
    "min_epochs": "the run's stop condition (stop.target_epochs, stop.target_samples) ends training",
    "min_steps": "the run's stop condition (stop.target_epochs, stop.target_samples) ends training",
    "enable_checkpointing": "the orchestrator keeps the run's checkpoints (checkpoint_every_epochs)",
    "default_root_dir": "a worker writes into its own worker directory",
    "logger": "name loggers by import path in trainer.loggers",
    "plugins": "precision plugins are chosen by trainer.precision",
}


def unknown_option_text(key: str, known: list[str]) -> str:
    """``'gradient_clip_value' is not a trainer option (did you mean 'gradient_clip_val'?)``, or with the
    list of options where no known one is close (as an unknown strategy option's message)."""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else f"the options are: {', '.join(sorted(known))}"
    return f"{key!r} is not a trainer option ({hint})"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def plain_json(value: dict[str, Any]) -> dict[str, Any]:
    """A field validator: ``value`` unchanged if it is plain JSON, else ValueError."""
    try:  # NaN and Infinity parse in Python but are not JSON: the database and clients would choke
        json.dumps(value, allow_nan=False)
    except ValueError as exc:
        raise ValueError(f"not plain JSON: {exc}") from exc
    return value


class TrainerPlugin(_Strict):
    """A Lightning callback or logger every worker adds to its Trainer: a class and its keyword arguments.

    A plain string is short for ``{"path": ...}``. The class must import on the orchestrator (checked when
    the run is created, like ``module``) and on every worker.
    """

    path: ImportPath = Field(
        max_length=255,
        description="The class as `package.module:Class`, "
        "e.g. `lightning.pytorch.callbacks:LearningRateMonitor`.",
    )
    args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the class.")

    @model_validator(mode="before")
    @classmethod
    def _from_path(cls, value: Any) -> Any:
        return {"path": value} if isinstance(value, str) else value

    _args_are_json = field_validator("args")(plain_json)


class TrainerSection(_Strict):
    """Options of every worker's Lightning ``Trainer``; each one left out keeps Lightning's default.

    Keywords the agent or ``HivemindStrategy`` owns are refused with the reason
    (:data:`RESERVED_TRAINER_KEYS`); unknown keywords are refused too.
    """

    precision: Literal["32-true", "16-mixed", "bf16-mixed"] = Field(
        default="32-true",
        description="Numeric precision: 32-true, 16-mixed (fp16 autocast with hivemind's gradient scaler; "
        "bf16 on a CPU) or bf16-mixed.",
    )
    gradient_clip_val: float | None = Field(
        default=None,
        ge=0,
        le=1e9,
        allow_inf_nan=False,
        description="Clip each local batch's gradients to this norm (or value); not with "
        "strategy_options reuse_grad_buffers, whose buffers hold many batches' sum.",
    )
    gradient_clip_algorithm: Literal["norm", "value"] | None = Field(
        default=None, description="How gradient_clip_val clips: norm (Lightning's default) or value."
    )
    val_check_interval: int | float | None = Field(
        default=None,
        description="Validate every this many training batches (int) or fraction of a local pass over the "
        "data (float in (0, 1]; 1.0: at the end of each pass); default: every 60 s of a worker's training.",
    )
    check_val_every_n_epoch: int | None = Field(
        default=1,
        ge=1,
        le=1_000_000,
        description="Validate every N local passes; null: validation counted by val_check_interval batches "
        "only, across passes (for long or streaming data that a worker may never finish).",
    )
    limit_val_batches: int | float | None = Field(
        default=None,
        description="Validation batches per check (int) or fraction of the validation data (float in "
        "[0, 1]); 0 turns validation off.",
    )
    log_every_n_steps: int | None = Field(
        default=None, ge=1, le=1_000_000, description="How often loggers get training-step metrics (50)."
    )
    deterministic: bool | Literal["warn"] | None = Field(
        default=None, description="torch deterministic algorithms (true, false or warn)."
    )
    callbacks: list[TrainerPlugin] = Field(
        default_factory=list,
        max_length=MAX_TRAINER_PLUGINS,
        description="Extra callbacks. ModelCheckpoint and EarlyStopping are refused (the orchestrator "
        "keeps the checkpoints; one worker's early stop would not stop the run).",
    )
    loggers: list[TrainerPlugin] = Field(
        default_factory=list,
        max_length=MAX_TRAINER_PLUGINS,
        description="Loggers (e.g. `lightning.pytorch.loggers:CSVLogger`). They write on each worker's "
        "disk, which a spot instance loses: the orchestrator can forward the reported metrics instead.",
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse_reserved(cls, value: Any) -> Any:
        if isinstance(value, dict):
            for key in value:
                if key in RESERVED_TRAINER_KEYS:
                    raise ValueError(f"{key} cannot be set: {RESERVED_TRAINER_KEYS[key]}")
                if isinstance(key, str) and key not in cls.model_fields:
                    raise ValueError(unknown_option_text(key, list(cls.model_fields)))
        return value

    @field_validator("callbacks", "loggers", mode="before")
    @classmethod
    def _a_list(cls, value: Any, info: ValidationInfo) -> Any:
        """One class given as a string is a list's worth: say how to write it (pydantic's "Input should be
        a valid list" does not)."""
        if isinstance(value, str):
            raise ValueError(f'a list is needed, one class per entry: {info.field_name}=["{value}"]')
        return value

    @field_validator("val_check_interval", "limit_val_batches", mode="before")
    @classmethod
    def _not_a_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("a number is needed, not true or false")
        return value

    @field_validator("val_check_interval", "limit_val_batches")
    @classmethod
    def _batches_or_fraction(cls, value: int | float | None, info: ValidationInfo) -> int | float | None:
        """Batches (int) from 1 for an interval, from 0 for a limit; or a fraction (float) up to 1, above 0
        for an interval."""
        interval = info.field_name == "val_check_interval"
        if isinstance(value, int) and not int(interval) <= value <= 10**9:
            raise ValueError(f"an int (batches) must lie in [{int(interval)}, 10^9]")
        if isinstance(value, float):
            above_lowest = value > 0.0 if interval else value >= 0.0
            if not above_lowest or value > 1.0:
                raise ValueError(f"a float (a fraction) must lie in {'(0' if interval else '[0'}, 1]")
        return value

    def validation_cadence(self) -> dict[str, Any]:
        """``val_check_interval`` for the ``Trainer`` when this section sets no validation cadence: every
        :data:`DEFAULT_VAL_CHECK_INTERVAL_S` seconds of training (Lightning's time-based interval); {}
        when it sets one (``val_check_interval: 1.0`` is Lightning's end of each local pass)."""
        if self.val_check_interval is None and self.check_val_every_n_epoch == 1:
            return {"val_check_interval": timedelta(seconds=DEFAULT_VAL_CHECK_INTERVAL_S)}
        return {}

    def trainer_kwargs(self) -> dict[str, Any]:
        """The keywords for ``Trainer(...)`` this section changes (callbacks and loggers apart): the
        defaults here are Lightning's own, so only values that differ from them are passed."""
        return self.model_dump(exclude={"callbacks", "loggers"}, exclude_defaults=True)


def trainer_option_in_strategy_options(options: dict[str, Any]) -> str | None:
    """A message when ``strategy_options`` holds a Trainer keyword (it would fail in hivemind's Optimizer)."""
    for key in options:
        if key in TrainerSection.model_fields:
            return f"{key} is a Trainer option, not a HivemindStrategy keyword: set it in the trainer section"
        if key in RESERVED_TRAINER_KEYS:
            return f"{key} is a Trainer option that runs cannot set: {RESERVED_TRAINER_KEYS[key]}"
    return None


def check_report_patterns(patterns: list[str]) -> list[str]:
    """``patterns`` unchanged, or ValueError for a duplicate (each becomes one bounded set of names)."""
    if len(set(patterns)) != len(patterns):
        raise ValueError("report_metrics lists a pattern twice")
    return patterns


@lru_cache(maxsize=4096)
def metric_matches(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``name`` is one of ``patterns`` or matches one (``*``, ``?``, ``[...]``; case-sensitive)."""
    return any(name == pattern or fnmatchcase(name, pattern) for pattern in patterns)


def select_metrics(values: dict[str, float], patterns: tuple[str, ...]) -> dict[str, float]:
    """The entries of ``values`` whose names match ``patterns``: at most :data:`MAX_REPORTED_METRICS`,
    first by name, only valid names. The caller makes sure the values are finite."""
    names = sorted(name for name in values if is_metric_name(name) and metric_matches(name, patterns))
    return {name: values[name] for name in names[:MAX_REPORTED_METRICS]}
