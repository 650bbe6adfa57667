"""The local launcher's fork server: ``python -m orchestrator.launchers.forkserver_main <server pid>``.

A worker started in a fresh interpreter spends about 5 s of CPU importing Lightning, torch and hivemind
before its first step (more on a busy machine). This process imports them once and forks every worker
from itself (``bench/worker_start.py``: launch to first sample in about half the time).
:class:`~orchestrator.launchers.forkserver.ForkServer` drives it; the local launcher falls back to a fresh
interpreter whenever it cannot be used.

Protocol, one JSON object per line: once its imports are done it writes ``{"ready": true, "pid": N}``;
then it answers each request on stdin, one at a time:

- a worker (``{"request_id", "env", "cwd", "log_path", "exit_path", "module", "marker"}``):
  ``{"pid": N}`` (the worker's supervisor, the leader of its process group) or ``{"error": "..."}``;
- a call (``{"call": "module:function", "argument": {...}}``): ``{"result": function(argument)}``, a
  JSON object, or ``{"error": "..."}``. The import check runs this way
  (:func:`worker.agent.probe.check_in_child`, which forks a child per check); named by
  path, so that this module imports nothing of the server's upper layers.

When a supervisor it started exits it writes ``{"exit": N, "code": C}`` (``subprocess.Popen``'s
convention: a negative code is the signal that killed it). It ends at end of file on stdin or when the
server exits, leaving its workers running: they outlive the server, as workers started the plain way do.

A worker is the same pair of processes as one the launcher starts the plain way (its supervisor shell):
a supervisor, leader of a new session and process group, that ignores SIGTERM, SIGINT and SIGHUP until
its worker has exited, writes the worker's exit code to the exit file (128+N for a signal N) and exits
with it; and the worker under it, which runs ``module`` as ``__main__`` with the request's environment
and working directory, the default signal dispositions and hivemind's inter-process locks of its own
(:func:`~worker._hivemind_compat.own_mpfuture_locks`). The launcher and the server's stop find a
worker's processes by the marker in their environment as the kernel shows it (``/proc/<pid>/environ``,
the environment a process was exec'd with, which a forked child shares with its parent): this process
is exec'd with a placeholder variable (:data:`SLOT_ENV`) that each supervisor overwrites in place with
the marker of its request before it forks the worker, whose children (hivemind's DHT and p2pd) inherit
it. The worker's command line is rewritten the same way to read as a plain worker's.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import runpy
import select
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import files
from worker.runtime.lifeline import exit_with_parent, stat_fields

#: the placeholder variable a supervisor turns into its request's marker (name and value rewritten)
SLOT_ENV = "SPOTSWARM_LAUNCH_SLOT"
#: the placeholder's value: room for ``SPOTSWARM_LOCAL_LAUNCH=`` and a request id of 64 characters
SLOT_VALUE = "." * 96
#: what is imported before the first fork: what a worker imports before it trains, and the import check
PRELOAD = (
    "lightning.pytorch",
    "hivemind",
    "hivemind.dht.crypto",
    "worker.agent",
    "worker.agent.agent",
    "worker.agent.boot",
    "worker.agent.rejoin",
    "worker.agent.token_cache",
    "worker.agent.training",
    "worker.admission.authorizer",
    "worker.strategy",
    "worker.strategy.dht",
    "worker.strategy.options",
    "worker.agent.probe",
)
#: what is called once the imports are done, before the first fork (named by path, as calls are)
WARM_UP = "worker.agent.probe:warm_up"
#: how long a supervisor may take to report that its worker is forked
SUPERVISOR_READY_S = 10.0
#: ``/proc/<pid>/stat`` fields (counted after the command name, as :func:`stat_fields` gives them) that
#: bound the command line and the environment in the process's memory (proc(5): fields 48-51)
_ARG_START, _ARG_END, _ENV_START, _ENV_END = 45, 46, 47, 48


@dataclass(frozen=True)
class Job:
    """What a forked worker runs: the request, as received."""

    request_id: str
    env: dict[str, str]
    cwd: str
    log_path: str
    exit_path: str
    module: str
    marker: str

    @classmethod
    def from_request(cls, request: dict[str, Any]) -> Job:
        return cls(
            request_id=str(request["request_id"]),
            env={str(k): str(v) for k, v in request["env"].items()},
            cwd=str(request["cwd"]),
            log_path=str(request["log_path"]),
            exit_path=str(request["exit_path"]),
            module=str(request["module"]),
            marker=str(request["marker"]),
        )


def _rewrite_block(start_field: int, end_field: int, entry: bytes | None, new: bytes) -> bool:
    """Overwrite, in this process's memory, the entry of its exec'd command line or environment that
    starts with ``entry`` (None: the whole block) with ``new`` padded with NULs; False where it does not
    fit or there is no such entry."""
    fields = stat_fields(os.getpid())
    if fields is None:
        return False
    start, end = int(fields[start_field]), int(fields[end_field])
    block = ctypes.string_at(start, end - start)
    offset, length = 0, len(block)
    if entry is not None:
        found = (b"\0" + block).find(b"\0" + entry)
        if found < 0:
            return False
        stop = block.find(b"\0", found)
        offset, length = found, (stop if stop >= 0 else len(block)) - found
    if len(new) > length:
        return False
    ctypes.memmove(start + offset, new + b"\0" * (length - len(new)), length)
    return True


def claim_marker(marker: str) -> bool:
    """Turn the :data:`SLOT_ENV` placeholder into ``marker`` (``NAME=VALUE``) as ``/proc`` shows this
    process's environment; True once ``/proc/self/environ`` holds it."""
    _rewrite_block(_ENV_START, _ENV_END, f"{SLOT_ENV}=".encode(), marker.encode())
    return marker.encode() in Path("/proc/self/environ").read_bytes().split(b"\0")


def _supervise(job: Job, ready_fd: int) -> Job:
    """In the supervisor (a fresh child): lead a new session, take the marker, fork the worker and
    return its job in the worker; in the supervisor, wait for it, record its exit code and exit."""
    os.setsid()
    if not claim_marker(job.marker):
        os.write(ready_fd, b"the environment marker could not be written")
        os._exit(1)
    _rewrite_block(_ARG_START, _ARG_END, None, b"spotswarm-supervisor\0" + job.request_id.encode())
    redirect_output(job.log_path)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # the supervisor shell's trap
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        os.close(ready_fd)
        return job
    os.write(ready_fd, b"ok")
    os.close(ready_fd)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    code = 128 - code if code < 0 else code  # as a shell reports a worker killed by a signal
    files.write_atomic(Path(job.exit_path), f"{code}\n")
    os._exit(code)


def _become_worker(job: Job) -> None:
    """In the worker: the request's environment, directory and arguments, fresh random seeds, the
    signal dispositions of a new interpreter, and hivemind's inter-process locks of its own (made when
    this process imported hivemind, they would be shared by every worker forked here: one killed while
    it holds one would block the DHT start of every later one)."""
    from worker._hivemind_compat import own_mpfuture_locks  # preloaded here; not by the launcher

    own_mpfuture_locks()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(job.env)
    os.chdir(job.cwd)
    sys.path[0] = job.cwd  # where ``python -m`` puts the working directory
    sys.argv = [job.module]
    sys.stdin = open(os.devnull)  # noqa: SIM115 - the interpreter's stdin, open for the process's life
    command = [sys.executable, "-m", job.module]
    _rewrite_block(_ARG_START, _ARG_END, None, "\0".join(command).encode())
    import numpy
    import torch

    torch.seed()  # a fresh interpreter draws its seeds; forked ones would share the server's
    numpy.random.seed()


def _start(request: dict[str, Any], protocol_fd: int) -> tuple[Job | None, dict[str, Any]]:
    """Fork the supervisor of ``request``; in the worker return its job, here the reply to send."""
    job = Job.from_request(request)
    read_fd, ready_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the supervisor: it returns only in the worker it forks, never into this loop
        try:
            os.close(read_fd)
            os.close(protocol_fd)
            return _supervise(job, ready_fd), {}
        except BaseException as exc:  # noqa: BLE001 - a supervisor that fails must never serve requests
            with contextlib.suppress(OSError):
                os.write(ready_fd, f"{type(exc).__name__}: {exc}".encode())
            os._exit(1)
    os.close(ready_fd)
    try:
        readable, _, _ = select.select([read_fd], [], [], SUPERVISOR_READY_S)
        said = os.read(read_fd, 4096) if readable else b"no answer"
    finally:
        os.close(read_fd)
    if said != b"ok":
        return None, {"error": f"the worker's supervisor did not start: {said.decode(errors='replace')}"}
    return None, {"pid": pid}


def redirect_output(log_path: str) -> None:
    """Stdin from ``/dev/null``, stdout and stderr appended to ``log_path``, as a shell's redirections."""
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    os.close(null_fd)


def send(protocol_fd: int, message: dict[str, Any]) -> None:
    """Write one message of the protocol: a JSON object on a line."""
    os.write(protocol_fd, (json.dumps(message) + "\n").encode())


def report_exits(protocol_fd: int) -> None:
    """Report every child (here, a supervisor) that has exited."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        send(protocol_fd, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _call(request: dict[str, Any]) -> dict[str, Any]:
    """Run the function a call request names; its result, or the error it raised."""
    module_name, _, name = str(request["call"]).partition(":")
    function = getattr(importlib.import_module(module_name), name)
    try:
        return {"result": dict(function(request.get("argument") or {}))}
    except Exception as exc:  # noqa: BLE001 - reported to the caller, which decides
        return {"error": f"{type(exc).__name__}: {exc}"}


def request_lines(protocol_fd: int) -> Iterator[bytes]:
    """Each request line read from stdin until end of file, every exited child reported while it waits
    (at least every 0.2 s)."""
    pending = b""
    while True:
        readable, _, _ = select.select([0], [], [], 0.2)
        report_exits(protocol_fd)
        if not readable:
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            yield line


def serve(protocol_fd: int) -> Job | None:
    """Answer requests until end of file (None); in a forked worker, return its job."""
    for line in request_lines(protocol_fd):
        try:
            request = json.loads(line)
            job, reply = (None, _call(request)) if "call" in request else _start(request, protocol_fd)
        except (ValueError, KeyError, TypeError, OSError, ImportError, AttributeError) as exc:
            job, reply = None, {"error": f"{type(exc).__name__}: {exc}"}
        if job is not None:
            return job
        send(protocol_fd, reply)
    return None


def main() -> None:
    exit_with_parent(int(sys.argv[1]) if len(sys.argv) > 1 else os.getppid(), keep_children=True)
    protocol_fd = os.dup(1)
    os.dup2(2, 1)  # anything printed while importing goes to stderr, not into the protocol
    for name in PRELOAD:
        importlib.import_module(name)
    module_name, _, name = WARM_UP.partition(":")
    getattr(importlib.import_module(module_name), name)()
    send(protocol_fd, {"ready": True, "pid": os.getpid()})
    job = serve(protocol_fd)
    if job is None:
        return
    _become_worker(job)
    runpy.run_module(job.module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
