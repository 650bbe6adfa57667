"""A process that has imported what ``spotswarm serve`` (``server``) or a worker (``worker``) imports,
and forks one process per request: ``python -m tests.programs.preloaded server|worker`` (driven by
:mod:`tests.support.preloaded`).

A server started from a fresh interpreter spends about 3 of its 5 CPU-seconds to ready importing
(hivemind brings torch and scipy), a worker more (Lightning as well); the suite starts dozens of each.
Forked from here, they skip those imports and run the same code from their entry point on: the CLI's
``main`` (``spotswarm``), the agent's (``spotswarm-worker``) or a test program's module run as
``__main__`` (``python -m tests.programs...``). The local launcher's fork server
(``orchestrator/launchers/forkserver_main.py``) does the same for the workers it starts; this is its
counterpart for the processes the tests start.

Protocol, one JSON object per line: once its imports are done it writes ``{"ready": true}``; it answers
each request ``{"main": "module:function" or "module": "name", "argv", "env", "cwd", "log_path"}``
with ``{"pid": N}``, and writes ``{"exit": N, "code": C}`` when a child exits (``subprocess.Popen``'s
convention: a negative code is the signal that killed it). It ends at end of file on stdin (its test
process has ended).

A child is what the command is once its imports are done: the leader of a new session, stdin from
``/dev/null``, stdout and stderr appended to ``log_path``, the request's environment, working
directory and arguments, Python's default signal handlers, fresh random seeds and hivemind's
inter-process locks of its own; it leaves through the interpreter's normal exit (atexit handlers, threads
joined). What differs from an exec'd process: ``/proc`` shows this process's command line and
environment for it, and it inherits no signal disposition from the test. Tests about those (a server's
exit and its signals: tests/integration/test_clean_exits.py) start their processes the plain way.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import signal
import sys
import traceback
from typing import Any

from orchestrator.launchers.forkserver_main import PRELOAD as WORKER_PRELOAD
from orchestrator.launchers.forkserver_main import redirect_output, request_lines, send

#: what each kind imports before its first fork: what ``spotswarm serve`` imports before it answers,
#: and what a worker imports before it trains (the local launcher's fork server's list)
PRELOAD = {
    "server": (
        "hivemind",
        "hivemind.dht.crypto",
        "uvicorn",
        "alembic.command",
        "orchestrator.cli",
        "orchestrator.app",
        "orchestrator.cli.http_server",
        "orchestrator.cli.stopping",
        "orchestrator.db.session",
        "orchestrator.domain.deployment_facts",
        "orchestrator.swarm.admission",
        "orchestrator.swarm.dht_process",
        "orchestrator.swarm.peer_authorizer",
        "orchestrator.storage.local",
        "worker.admission.authorizer",
        "worker.admission.guard",
        "worker.admission.tokens",
        "worker.runtime.logsetup",
        "worker.strategy.dht",
        "sqlalchemy.dialects.sqlite.pysqlite",
        "uvicorn.loops.uvloop",
        "uvicorn.protocols.http.httptools_impl",
        "uvicorn.protocols.websockets.websockets_sansio_impl",
        "cid",
        "multibase",
        "netaddr",
    ),
    "worker": WORKER_PRELOAD,
}


def _become(request: dict[str, Any], protocol_fd: int) -> None:
    """In the child: everything the command exec'd would have, but for its imports."""
    from worker._hivemind_compat import own_mpfuture_locks

    os.setsid()
    os.close(protocol_fd)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    redirect_output(request["log_path"])
    own_mpfuture_locks()
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = list(request["argv"])
    import numpy
    import torch

    torch.seed()  # a fresh interpreter draws its seeds; forked ones would share this process's
    numpy.random.seed()


def serve(protocol_fd: int) -> dict[str, Any] | None:
    """Answer requests until end of file (None); in a forked child, return its request."""
    for line in request_lines(protocol_fd):
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                _become(request, protocol_fd)
            except BaseException:  # noqa: BLE001 - a child that cannot become its command must not serve
                traceback.print_exc()
                os._exit(70)
            return request
        send(protocol_fd, {"pid": pid})
    return None


def main() -> None:
    protocol_fd = os.dup(1)
    os.dup2(2, 1)  # anything printed while importing goes to stderr, not into the protocol
    for name in PRELOAD[sys.argv[1]]:
        importlib.import_module(name)
    send(protocol_fd, {"ready": True})
    request = serve(protocol_fd)
    if request is None:
        return
    if "module" in request:  # ``python -m <module>``: the working directory first on the import path
        sys.path[0] = request["cwd"]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        return
    module, _, function = request["main"].partition(":")
    sys.path[0] = os.path.dirname(sys.argv[0])  # a console script's: the directory it is in
    sys.exit(getattr(importlib.import_module(module), function)())


if __name__ == "__main__":
    main()
