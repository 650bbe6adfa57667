"""The import probe: ``python -m orchestrator.import_probe``, driven by :mod:`orchestrator.importcheck`.

It imports Lightning once, then answers one JSON request per stdin line
(``{"checks": [check, ...], "timeout_s": float}``) with one JSON line (``{"ok": bool, "error": str,
"field": str}``: the first check that failed). A check is ``{"field": "module", "kind": "module" |
"datamodule", "path": "pkg.mod:Class"}``, ``{"field": ..., "kind": "callback" | "logger", "path": ...,
"args": {...}}`` (a trainer callback or logger: the class and that its arguments bind) or
``{"field": "strategy_options", "kind": "strategy_options", "keys": [...]}`` (keywords
``HivemindStrategy`` takes). Each request is handled in a forked child, so a user's module is imported
fresh, and whatever it does at import time (print, exit, crash, hang) cannot touch the server: the
child's stdout goes to stderr, and a child that outlives ``timeout_s`` is killed.

The probe ends with the server: at end of file on stdin, and as soon as the server (whose PID is the
first argument) exits, even killed with SIGKILL while the probe still imports Lightning.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import select
import signal
import sys
from typing import Any

from orchestrator.proctree import exit_with_parent


def _check_class(path: str, kind: str, args: dict[str, Any]) -> str | None:
    """None when ``path`` names a class fit for ``kind`` (and, for callbacks and loggers, ``args``)."""
    from lightning.pytorch import LightningDataModule, LightningModule

    from worker.trainer_options import arguments_problem, plugin_class_problem

    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except BaseException as exc:  # noqa: BLE001 - the child reports anything the user's module raises
        return f"cannot import {module_name!r}: {type(exc).__name__}: {exc}"
    target = getattr(module, attr, None)
    if target is None:
        return f"module {module_name!r} has no attribute {attr!r}"
    if kind in ("callback", "logger"):
        problem = plugin_class_problem(target, "callback" if kind == "callback" else "logger")
        problem = problem or arguments_problem(target, args)
        return f"{path}: {problem}" if problem else None
    base = LightningModule if kind == "module" else LightningDataModule
    if not inspect.isclass(target) or not issubclass(target, base):
        return f"{path} is not a {base.__name__} subclass"
    return None


def _check(check: dict[str, Any]) -> str | None:
    """None when ``check`` (see the module docstring) passes, else the reason."""
    if check["kind"] == "strategy_options":
        from worker.strategy_options import strategy_option_problem

        return strategy_option_problem(dict.fromkeys(check["keys"]))
    return _check_class(str(check["path"]), str(check["kind"]), dict(check.get("args") or {}))


def _first_failure(checks: list[dict[str, Any]]) -> dict[str, Any]:
    for check in checks:
        error = _check(check)
        if error:
            return {"ok": False, "error": error, "field": str(check["field"])}
    return {"ok": True, "error": "", "field": ""}


def _in_child(checks: list[dict[str, Any]], timeout_s: float) -> dict[str, Any]:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: import, report, leave without running any cleanup of the parent's
        os.close(read_fd)
        os.dup2(2, 1)
        try:
            reply = _first_failure(checks)
        except BaseException as exc:  # noqa: BLE001 - reported as the failure of this request
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "field": ""}
        os.write(write_fd, json.dumps(reply).encode())
        os._exit(0)
    os.close(write_fd)
    ready, _, _ = select.select([read_fd], [], [], timeout_s)
    what = ", ".join(str(c.get("path") or c["field"]) for c in checks)
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


def main() -> None:
    exit_with_parent(int(sys.argv[1]) if len(sys.argv) > 1 else os.getppid())
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything printed by Lightning or user code goes to stderr, not into the protocol
    import lightning.pytorch  # noqa: F401 - imported once here, inherited by every child

    from worker.strategy_options import strategy_keywords

    strategy_keywords()  # imports hivemind and the strategy once, for every child

    protocol.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        reply = _in_child(list(request["checks"]), float(request.get("timeout_s", 30)))
        protocol.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
