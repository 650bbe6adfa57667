"""The import checks of a run about to be created, run in the server's fork server
(``orchestrator/launchers/forkserver_main.py``), which has Lightning and hivemind imported already; driven
by ``orchestrator/importcheck/checker.py``, which names :func:`check_in_child` by path (the orchestrator
imports nothing of the agent). They are the checks a worker would fail on, made with the agent's own code.

:func:`check_in_child` takes one request (``{"checks": [check, ...], "timeout_s": float, "cwd": str}``,
optionally with the run's ``package_dir``, ``site_dir`` and ``env``) and returns ``{"ok": bool, "error":
str, "field": str}``: the first check that failed. A check is ``{"field": "module", "kind": "module" |
"datamodule", "path": "pkg.mod:Class", "args": {...}, "batch_size": int}`` (the class, that its
constructor takes the arguments as the agent passes them, and that their values fit its annotations:
:mod:`worker.arguments`; a failure there names ``module_args`` or ``datamodule_args``, and the argument
when its value is the problem), ``{"field": ..., "kind": "callback" | "logger", "path": ..., "args":
{...}}`` (a trainer callback or logger: the class, that its arguments bind, and that it can be built, as
the worker builds it: a logger whose package is missing fails only then) or ``{"field":
"strategy_options", "kind": "strategy_options", "options": {...}}`` (keywords ``HivemindStrategy`` takes,
with values it can run together: the strategy's own checks). Each request is handled in a forked child,
so a user's module is imported fresh, and whatever it does at import time or when a plugin is built
(print, exit, crash, hang) cannot touch the server or the fork server: the child's stdout goes to
stderr, and a child that outlives ``timeout_s`` is killed. The child works in ``cwd`` (the checker's
temporary directory), or in the run's package directory when it has one.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import select
import signal
from pathlib import Path
from typing import Any

from worker.agent.boot import call_arguments
from worker.arguments import argument_type_problem
from worker.runtime.env import activate


def _check_class(
    field: str, path: str, kind: str, args: dict[str, Any], batch_size: int | None
) -> tuple[str, str] | None:
    """None when ``path`` names a class fit for ``kind`` that takes ``args``, else (field, reason): a
    module or datamodule whose constructor does not take ``args`` names ``<field>_args``."""
    from lightning.pytorch import LightningDataModule, LightningModule

    from worker.protocol.trainer import arguments_problem, plugin_class_problem

    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except BaseException as exc:  # noqa: BLE001 - the child reports anything the user's module raises
        return field, f"cannot import {module_name!r}: {type(exc).__name__}: {exc}"
    target = getattr(module, attr, None)
    if target is None:
        return field, f"module {module_name!r} has no attribute {attr!r}"
    if kind in ("callback", "logger"):
        problem = plugin_class_problem(target, "callback" if kind == "callback" else "logger")
        problem = problem or arguments_problem(target, args) or _construction_problem(target, args)
        return (field, f"{path}: {problem}") if problem else None
    base = LightningModule if kind == "module" else LightningDataModule
    if not inspect.isclass(target) or not issubclass(target, base):
        return field, f"{path} is not a {base.__name__} subclass"
    error = _bind_error(target, args, batch_size)
    if error:
        return f"{field}_args", error
    mistyped = argument_type_problem(target, args)
    return (f"{field}_args.{mistyped[0]}", mistyped[1]) if mistyped else None


def _construction_problem(target: type, args: dict[str, Any]) -> str | None:
    """Why the worker could not build this callback or logger (as it will: the same function), or None."""
    from worker.protocol.trainer import TrainerPluginError, construct_plugin

    try:
        construct_plugin(target, args)
    except TrainerPluginError as exc:
        return str(exc)
    return None


def _bind_error(target: type, args: dict[str, Any], batch_size: int | None) -> str | None:
    """Why ``target(**args)`` (as the agent calls it) would fail on its signature, or None."""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # no signature to read (some extension types): the worker finds out
        return None
    params = signature.parameters
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    takes = f"(it takes: {', '.join(n for n, p in params.items() if p.kind in kinds) or 'nothing'})"
    arguments = call_arguments(target, args, batch_size)
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        unknown = [repr(name) for name in arguments if name not in params or params[name].kind not in kinds]
        if unknown:
            return f"{target.__name__} takes no argument {', '.join(unknown)} {takes}"
    try:
        signature.bind(**arguments)
    except TypeError as exc:
        return f"{target.__name__}: {exc} {takes}"
    return None


def _check(check: dict[str, Any]) -> tuple[str, str] | None:
    """None when ``check`` (see the module docstring) passes, else (the field that failed, the reason)."""
    field = str(check["field"])
    if check["kind"] == "strategy_options":
        from worker.strategy.options import strategy_option_problem

        problem = strategy_option_problem(dict(check["options"]))
        return (field, problem) if problem else None
    args, batch_size = dict(check.get("args") or {}), check.get("batch_size")
    return _check_class(field, str(check["path"]), str(check["kind"]), args, batch_size)


def _first_failure(request: dict[str, Any]) -> dict[str, Any]:
    package_dir, site_dir = request.get("package_dir"), request.get("site_dir")
    activate(Path(package_dir) if package_dir else None, Path(site_dir) if site_dir else None)
    os.environ.update(request.get("env") or {})
    for check in request["checks"]:
        failed = _check(check)
        if failed:
            field, error = failed
            return {"ok": False, "error": error, "field": field}
    return {"ok": True, "error": "", "field": ""}


def warm_up() -> dict[str, Any]:
    """Read what every check needs once, in the fork server before its first fork: hivemind's keywords."""
    from worker.strategy.options import strategy_keywords

    strategy_keywords()
    return {}


def check_in_child(request: dict[str, Any]) -> dict[str, Any]:
    """The first failure of ``request``'s checks (see the module docstring), found in a forked child."""
    timeout_s = float(request.get("timeout_s", 30))
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: import, report, leave without running any cleanup of the parent's
        os.close(read_fd)
        os.dup2(2, 1)
        try:
            if request.get("cwd"):
                os.chdir(request["cwd"])
            reply = _first_failure(request)
        except BaseException as exc:  # noqa: BLE001 - reported as the failure of this request
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "field": ""}
        os.write(write_fd, json.dumps(reply).encode())
        os._exit(0)
    os.close(write_fd)
    ready, _, _ = select.select([read_fd], [], [], timeout_s)
    what = ", ".join(str(c.get("path") or c["field"]) for c in request["checks"])
    if not ready:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read_fd)
        return {"ok": False, "error": f"checking {what} took longer than {timeout_s:.0f} s", "field": ""}
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        return {"ok": False, "error": f"checking {what} ended the process (status {status})", "field": ""}
    return dict(json.loads(b"".join(chunks)))
