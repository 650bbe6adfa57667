"""The Trainer options of a run (its ``trainer`` section), and the callbacks and loggers it names: which
a worker accepts and how it builds them. One home for what a run may set on each worker's Lightning
``Trainer``; the strategy's own keywords are :mod:`worker.strategy.options`.

The ``trainer`` section holds only options the agent can apply and ``HivemindStrategy`` can honour.
Everything else is refused when the run is created, with the reason (see :data:`RESERVED_TRAINER_KEYS`),
instead of failing on every worker after launch. A callback or logger must import, be of the right base,
take its arguments and build (:func:`load_plugin_class`, :func:`construct_plugin`), checked by the
create-time probe (``worker/agent/probe.py``) and again by every worker. Shared too: :data:`QUIET` and
:data:`NO_VALIDATION`, the Trainer keywords of the agent, the examples, the test peers and the
benchmarks. Pydantic only at import; Lightning is imported when a class is checked or built.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
from collections.abc import Sequence
from datetime import timedelta
from types import MappingProxyType
from typing import Any, Final, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from worker.protocol.validators import ImportPath, StrictModel, plain_json

#: Precisions ``HivemindStrategy`` trains with: fp32, bf16 autocast, and fp16 autocast with hivemind's
#: gradient scaler (``worker/strategy/precision.py``). On a CPU, Lightning runs "16-mixed" as bf16.
TRAINER_PRECISIONS = ("32-true", "16-mixed", "bf16-mixed")
MAX_TRAINER_PLUGINS = 16  # callbacks, and loggers, per run
#: How often a worker validates, in seconds of its training, when the run's ``trainer`` section sets no
#: cadence (``val_check_interval`` left out, ``check_val_every_n_epoch`` at 1): Lightning's own default,
#: the end of each local pass over the data, can be many minutes away on a real data set, and a run
#: whose first ``val_loss`` comes that late looks broken. A worker also validates as it stops.
DEFAULT_VAL_CHECK_INTERVAL_S = 60.0
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


class TrainerPlugin(StrictModel):
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


class TrainerSection(StrictModel):
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


#: A Trainer that writes nothing of its own (no logger, checkpoint files, progress bar or model summary):
#: the process reports its progress itself (heartbeats, JSON lines, printed figures).
QUIET: Final = MappingProxyType[str, Any](
    {
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
)

#: No validation loop and no sanity check: for training-only peers.
NO_VALIDATION: Final = MappingProxyType[str, Any]({"num_sanity_val_steps": 0, "limit_val_batches": 0})

PluginKind = Literal["callback", "logger"]

#: Stock callbacks a run's workers do not take, and why (subclasses included).
REFUSED_CALLBACKS = {
    "ModelCheckpoint": "the orchestrator keeps the run's checkpoints (checkpoint_every_epochs, "
    "keep_checkpoints); files a worker saved would be lost with its machine",
    "EarlyStopping": "it would end one worker's training, not the run (the orchestrator replaces a worker "
    "that leaves): end the run with stop.target_epochs or stop.target_samples, or watch its val_* "
    "metrics and stop it",
}


class TrainerPluginError(TypeError):
    """A callback or logger of the run's trainer section that a worker cannot use; says why."""


def plugin_class_problem(target: object, kind: PluginKind) -> str | None:
    """None when ``target`` is a class a worker can add as a ``kind``; else the reason it cannot."""
    from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
    from lightning.pytorch.loggers import Logger

    base = Callback if kind == "callback" else Logger
    if not inspect.isclass(target) or not issubclass(target, base):
        return f"is not a {base.__module__}.{base.__name__} subclass"
    for refused in (ModelCheckpoint, EarlyStopping):
        if kind == "callback" and issubclass(target, refused):
            return f"{refused.__name__} is not supported: {REFUSED_CALLBACKS[refused.__name__]}"
    return None


def arguments_problem(target: type, args: dict[str, Any]) -> str | None:
    """None when ``target(**args)`` binds to its signature; else why not, with the arguments it takes (no
    code of it runs)."""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # no signature to read (a builtin): only building it will tell
        return None
    try:
        signature.bind(**args)
    except TypeError as exc:
        return f"{exc} {takes_text(signature)}"
    return None


def takes_text(signature: inspect.Signature) -> str:
    """``(it takes: every, norm_type)``: the keyword arguments a class's constructor takes."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names = [name for name, param in signature.parameters.items() if param.kind in kinds]
    return f"(it takes: {', '.join(names) or 'nothing'})"


def load_plugin_class(plugin: TrainerPlugin, kind: PluginKind) -> type:
    """The class ``plugin.path`` names, checked; raises :class:`TrainerPluginError` saying why not."""
    module_name, _, attr = plugin.path.partition(":")
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise TrainerPluginError(f"{kind} {plugin.path}: cannot import: {type(exc).__name__}: {exc}") from exc
    problem = plugin_class_problem(target, kind) or arguments_problem(target, plugin.args)
    if problem:
        raise TrainerPluginError(f"{kind} {plugin.path}: {problem}")
    return target  # type: ignore[no-any-return]


def build_plugins(plugins: Sequence[TrainerPlugin], kind: PluginKind) -> list[Any]:
    """Instances of ``plugins`` for one worker's Trainer; raises :class:`TrainerPluginError`."""
    built = []
    for plugin in plugins:
        target = load_plugin_class(plugin, kind)
        try:
            built.append(construct_plugin(target, plugin.args))
        except TrainerPluginError as exc:
            raise TrainerPluginError(f"{kind} {plugin.path}: {exc}") from exc
    return built


def construct_plugin(target: type, args: dict[str, Any]) -> Any:
    """``target(**args)``; raises :class:`TrainerPluginError` with the reason when the class refuses.

    The create-time probe builds each plugin with it too: a logger whose package is missing (Lightning's
    ``WandbLogger`` without wandb) raises only when it is built, and must be refused at create time.
    """
    try:
        return target(**args)
    except Exception as exc:  # the user's class refused its arguments: a spec error
        raise TrainerPluginError(_construction_failure(exc)) from exc


#: how Lightning's loggers say a package they need is missing (lightning_utilities.RequirementCache)
_REQUIREMENT_NOT_MET = re.compile(r"Requirement '([^']+)' not met")


def _construction_failure(exc: Exception) -> str:
    """Why a plugin could not be built; a missing package is named with the run's fix (its requirements),
    not Lightning's ``pip install`` hint, which would install it on no worker."""
    found = _REQUIREMENT_NOT_MET.search(str(exc))
    package = found.group(1) if found else None
    if package is None and isinstance(exc, ModuleNotFoundError) and exc.name:
        package = exc.name.partition(".")[0]
    if package is None:
        return f"{type(exc).__name__}: {exc}"
    return (
        f"it needs {package}, which the run does not install: add it to the run's requirements "
        f"(spotswarm runs create --requirement '{package}', or requirements: in the spec)"
    )
