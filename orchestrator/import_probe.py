"""The import probe: ``python -m orchestrator.import_probe``, driven by :mod:`orchestrator.importcheck`.

It imports Lightning once, then answers one JSON request per stdin line
(``{"path": "pkg.mod:Class", "kind": "module" | "datamodule"}``) with one JSON line
(``{"ok": bool, "error": str}``). Each request is handled in a forked child, so a user's module is
imported fresh, and whatever it does at import time (print, exit, crash, hang) cannot touch the server:
the child's stdout goes to stderr, and a child that outlives ``timeout_s`` is killed.

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


def _check(path: str, kind: str) -> str | None:
    """None when ``path`` names a subclass of the Lightning base for ``kind``, else the reason."""
    from lightning.pytorch import LightningDataModule, LightningModule

    base = LightningModule if kind == "module" else LightningDataModule
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except BaseException as exc:  # noqa: BLE001 - the child reports anything the user's module raises
        return f"cannot import {module_name!r}: {type(exc).__name__}: {exc}"
    target = getattr(module, attr, None)
    if target is None:
        return f"module {module_name!r} has no attribute {attr!r}"
    if not inspect.isclass(target) or not issubclass(target, base):
        return f"{path} is not a {base.__name__} subclass"
    return None


def _in_child(path: str, kind: str, timeout_s: float) -> dict[str, Any]:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: import, report, leave without running any cleanup of the parent's
        os.close(read_fd)
        os.dup2(2, 1)
        error = _check(path, kind)
        os.write(write_fd, json.dumps({"ok": error is None, "error": error or ""}).encode())
        os._exit(0)
    os.close(write_fd)
    ready, _, _ = select.select([read_fd], [], [], timeout_s)
    if not ready:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read_fd)
        return {"ok": False, "error": f"importing {path} took longer than {timeout_s:.0f} s"}
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        return {"ok": False, "error": f"importing {path} ended the process (status {status})"}
    return json.loads(b"".join(chunks))


def main() -> None:
    exit_with_parent(int(sys.argv[1]) if len(sys.argv) > 1 else os.getppid())
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything printed by Lightning or user code goes to stderr, not into the protocol
    import lightning.pytorch  # noqa: F401 - imported once here, inherited by every child

    protocol.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        reply = _in_child(str(request["path"]), str(request["kind"]), float(request.get("timeout_s", 30)))
        protocol.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
