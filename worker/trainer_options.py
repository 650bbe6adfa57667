"""Trainer options shared by the worker agent, the examples, the test peers and the benchmarks, and the
callbacks and loggers of a run's ``trainer`` section (``worker/wire_trainer.py``): which classes a worker
accepts and how it builds them. Lightning is imported only when a class is checked or built.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any, Final, Literal

from worker.wire_trainer import TrainerPlugin

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
