"""The ``local`` launcher: each worker is a subprocess of this machine, in its own process group.

Layout under ``data_dir``::

    workers/<request_id>.log          the worker's stdout and stderr
    workers/<request_id>/             the worker's directory (SPOTSWARM_WORKER_DIR unless the env sets one)
    launcher-local/<request_id>.json  pid (its supervisor's), start time, the agent's pid once seen, run
                                      name, terminate/report flags
    launcher-local/<request_id>.exit  the worker's exit code, written by its supervisor

The state files make the launcher survive an orchestrator restart (even ``kill -9``): a new instance on the
same ``data_dir`` adopts the workers that still run (a PID counts only if its start time matches, so a
reused PID is never mistaken for a worker) and never launches a request id twice. Workers outlive the
orchestrator: they run in their own session, and :meth:`LocalLauncher.close` leaves them alone. Logs and
failures name a worker by its agent's PID (what ``ps`` shows a person), read from its supervisor's
children while it runs.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from orchestrator import files
from orchestrator.launchers import local_files as proc
from orchestrator.launchers.base import (
    MACHINE_DETAIL,
    PEER_INDEX_DETAIL,
    PEERS_OPTION,
    Instance,
    LauncherConfigError,
    LaunchFailure,
    LaunchRequest,
    PeerRequest,
    peers_option,
)
from orchestrator.launchers.childenv import child_env
from orchestrator.launchers.forkserver import ForkServer, ForkServerError
from orchestrator.launchers.local_cpus import (
    CPUS_ENV,
    CPUS_OPTION,
    allocate,
    check_capacity,
    cpu_list,
    cpus_per_worker,
    usable_cpus,
)
from orchestrator.processes import proc_start_ticks
from worker.protocol.exit_codes import PERMANENT_EXIT_CODES

logger = logging.getLogger(__name__)

#: most peers one local "machine" runs: processes here stand in for a multi-GPU instance's devices
MAX_LOCAL_PEERS_PER_MACHINE = 64
REQUEST_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# Set in every worker's environment (inherited by its children): finds a worker's processes when its PID
# alone cannot be trusted (a launch interrupted before the PID was recorded, children left by a dead leader).
LAUNCH_MARKER_ENV = "SPOTSWARM_LOCAL_LAUNCH"


#: the worker agent's module, run by the same Python interpreter as the orchestrator
WORKER_MODULE = "worker.agent"


def default_worker_command() -> list[str]:
    """The worker agent, run by the same Python interpreter as the orchestrator."""
    return [sys.executable, "-m", WORKER_MODULE]


_NOT_PERSISTED = frozenset({"popen", "forked_by"})


@dataclass
class _Record:
    """What the launcher knows of one request; everything but ``popen`` and ``forked_by`` is persisted."""

    request_id: str
    run_name: str
    log_path: str
    launched_at: float
    pid: int | None = None  # its supervisor's, the leader of its process group
    start_ticks: int | None = None
    agent_pid: int | None = None  # the worker agent's (the supervisor's child), once seen
    exit_code: int | None = None
    gone_at: float | None = None
    terminate_requested_at: float | None = None
    reported: bool = False
    #: the cores it is pinned to (``cpus_per_worker``); none: every core
    cpus: list[int] = field(default_factory=list)
    #: the machine it runs on (its first peer's request id; none: a machine of its own), and its device
    machine: str | None = None
    peer_index: int = 0
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)
    #: the fork server that forked it (it reports the exit), while that one runs; not persisted
    forked_by: int | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_PERSISTED}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> _Record:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k not in _NOT_PERSISTED}
        return cls(**known)

    @property
    def alive(self) -> bool:
        return self.pid is not None and self.gone_at is None

    @property
    def named_pid(self) -> str:
        """The PID a person knows the worker by (``ps`` shows it as the agent), for logs and reasons:
        the agent's once seen, else its supervisor's, said so."""
        return f"pid {self.agent_pid}" if self.agent_pid else f"supervisor pid {self.pid}"


class LocalLauncher:
    """Runs worker agents as local subprocesses; see the module docstring for the files it keeps.

    ``command`` replaces the worker agent (tests use a tiny script). ``cwd`` is the workers' working
    directory (default: this process's, so that workers import user modules as the orchestrator's
    import check does). ``grace_s`` is how long a worker has between SIGTERM and SIGKILL.
    ``keep_gone_s`` is how long a finished worker stays listed (and its request id stays reserved)
    after its exit was reported by :meth:`poll_errors`. A worker's environment is the request's env
    over an allow-list of this process's (:mod:`orchestrator.launchers.childenv`, plus the names in
    ``pass_env``), never the whole: the server's may hold the admin token, the database password and cloud
    keys.

    With ``preload`` (the default) and the default command, workers are forked from a process that has
    already imported Lightning, torch and hivemind (``forkserver``, the server's, or one of its own:
    :mod:`orchestrator.launchers.forkserver`): same processes, environment, marker and exit file as a
    plain start, about 5 s of CPU less per worker.
    """

    name = "local"

    def __init__(
        self,
        data_dir: Path,
        command: Sequence[str] | None = None,
        *,
        cwd: Path | None = None,
        grace_s: float = 20.0,
        keep_gone_s: float = 24 * 3600.0,
        clock: Callable[[], float] = time.time,
        pass_env: Sequence[str] = (),
        preload: bool = True,
        forkserver: ForkServer | None = None,
    ) -> None:
        self._command = list(command) if command else default_worker_command()
        self._pass_env = tuple(pass_env)
        self._cwd = Path(cwd) if cwd else Path.cwd()
        self._grace_s = grace_s
        self._keep_gone_s = keep_gone_s
        self._clock = clock
        self._state_dir = Path(data_dir) / "launcher-local"
        self._workers_dir = Path(data_dir) / "workers"
        self._state_dir.mkdir(parents=True, exist_ok=True)
        self._workers_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._records: dict[str, _Record] = {}
        self._failures: list[LaunchFailure] = []
        self._escalations: dict[str, threading.Timer] = {}
        self._forkserver: ForkServer | None = None
        if preload and not command:
            self._forkserver = forkserver or ForkServer(child_env(os.environ, self._pass_env), self._cwd)
            self._forkserver.watch_exits(self._forked_exit)
        self._adopt_existing()

    # -- the Launcher interface ------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> str:
        """Start the workers of ``request``'s machine, one process per peer, each unless its request id
        was ever launched here; return the first one's PID.

        Raises :class:`LauncherConfigError` for options it does not take or a request id unfit for a file
        name. With ``cpus_per_worker`` each worker gets cores of its own (:mod:`.local_cpus`). A worker
        that cannot be spawned is reported by :meth:`poll_errors`. The peers of one machine are processes
        like any other: each ends alone (:meth:`terminate`), and only the spot market treats them as one.
        """
        self.validate_options(request.options)
        for peer in request.peers:
            if not REQUEST_ID_PATTERN.match(peer.request_id):
                raise LauncherConfigError(f"request id {peer.request_id!r} is not [A-Za-z0-9_.-]{{1,64}}")
        if self._forkserver is not None:
            self._forkserver.warm_up()  # the first launch waits for its imports, without holding our lock
        machine = request.request_id if request.siblings else None
        handles = [
            self._launch_peer(request, peer, machine, index) for index, peer in enumerate(request.peers)
        ]
        return handles[0]

    def _launch_peer(self, request: LaunchRequest, peer: PeerRequest, machine: str | None, index: int) -> str:
        with self._lock:
            record = self._records.get(peer.request_id) or self._load(peer.request_id)
            if record is not None:
                return str(record.pid or "")
            record = _Record(
                request_id=peer.request_id,
                run_name=request.run_name,
                log_path=str(self._workers_dir / f"{peer.request_id}.log"),
                launched_at=self._clock(),
                machine=machine,
                peer_index=index,
            )
            if not self._reserve(record):  # another launcher on this data dir got there first
                adopted = self._load(peer.request_id)
                return str(adopted.pid or "") if adopted else ""
            self._records[record.request_id] = record
            self._spawn(record, self._with_cpus(record, request.options, peer.env))
            return str(record.pid or "")

    def validate_options(self, options: Mapping[str, Any], *, workers: int = 1) -> None:
        """The local launcher takes ``cpus_per_worker`` and ``peers_per_machine`` only: another option, a
        value that is not a positive int, or more cores than this machine has for ``workers`` workers
        is a :class:`LauncherConfigError` that says so."""
        unknown = sorted(set(options) - {CPUS_OPTION, PEERS_OPTION})
        if unknown:
            hint = " (a run's code travels with runs create --workdir DIR)" if "workdir" in unknown else ""
            raise LauncherConfigError(
                f"the local launcher takes no options but {CPUS_OPTION} and {PEERS_OPTION}, "
                f"got {unknown}{hint}"
            )
        peers_option(options, most=MAX_LOCAL_PEERS_PER_MACHINE)
        per_worker = cpus_per_worker(options)
        if per_worker is not None:
            check_capacity(per_worker, workers, usable_cpus())

    def peers_per_machine(self, options: Mapping[str, Any]) -> int:
        """``peers_per_machine`` of the run, else 1: a local "machine" is a group of worker processes
        that the spot market reclaims together."""
        return peers_option(options, most=MAX_LOCAL_PEERS_PER_MACHINE) or 1

    def _with_cpus(
        self, record: _Record, options: Mapping[str, Any], env: Mapping[str, str]
    ) -> dict[str, str]:
        """The peer's environment, with the worker's own cores when the run asks for them."""
        per_worker = cpus_per_worker(options)
        if per_worker is None:
            return dict(env)
        in_use = [cpu for other in self._records.values() if other.alive for cpu in other.cpus]
        record.cpus = allocate(per_worker, usable_cpus(), in_use)
        logger.info("worker %s (run %s): cores %s", record.request_id, record.run_name, cpu_list(record.cpus))
        return {**env, CPUS_ENV: cpu_list(record.cpus)}

    def terminate(self, request_id: str) -> None:
        """SIGTERM the worker's process group now, SIGKILL it after the grace period; never blocks."""
        with self._lock:
            record = self._records.get(request_id)
            if record is None or record.pid is None:
                return
            if record.terminate_requested_at is None:
                record.terminate_requested_at = self._clock()
                self._persist(record)
            if self._owns_group(record):
                logger.info("worker %s (run %s, pid %s): SIGTERM", request_id, record.run_name, record.pid)
                proc.signal_group(record.pid, signal.SIGTERM)
            self._schedule_escalation(record, self._grace_s)

    def kill(self, request_id: str) -> None:
        """SIGKILL the worker's process group now, as a machine that vanishes: not a requested stop, so
        its exit is reported by :meth:`poll_errors` like any other death."""
        with self._lock:
            record = self._records.get(request_id)
            if record is not None and record.alive and self._owns_group(record):
                logger.info("worker %s (run %s, pid %s): SIGKILL", request_id, record.run_name, record.pid)
                proc.signal_group(record.pid or 0, signal.SIGKILL)

    def describe(self) -> list[Instance]:
        """Every worker launched or adopted here that was not yet forgotten, alive or gone."""
        with self._lock:
            self._refresh()
            self._prune()
            return [self._instance(record) for record in self._records.values()]

    def poll_errors(self) -> list[LaunchFailure]:
        """Workers that failed since the last call, each reported once (also across restarts).

        A non-zero exit that this launcher did not ask for is a failure; exit codes 2, 3, 126 and 127
        (bad command line, permanent configuration error, command not runnable) are not retryable.
        """
        with self._lock:
            self._refresh()
            failures, self._failures = self._failures, []
            for record in self._records.values():
                if record.gone_at is None or record.reported:
                    continue
                record.reported = True
                self._persist(record)
                if record.terminate_requested_at is None and record.exit_code != 0:
                    failures.append(self._failure(record))
            return failures

    def close(self) -> None:
        """Stop the fork server; workers keep running, pending SIGKILL timers still fire (daemon threads)."""
        if self._forkserver is not None:
            self._forkserver.close()
        logger.debug("local launcher closed; %d worker(s) keep running", len(self._records))

    # -- spawning and watching -------------------------------------------------------------------

    def _spawn(self, record: _Record, request_env: Mapping[str, str]) -> None:
        worker_dir = self._workers_dir / record.request_id
        worker_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # owner-only, whatever the umask
        env = child_env(os.environ, self._pass_env)
        env.update({"SPOTSWARM_WORKER_DIR": str(worker_dir), **request_env})
        env.update({"PYTHONUNBUFFERED": "1", LAUNCH_MARKER_ENV: record.request_id})
        if self._forkserver is not None and self._forkserver.fits(env) and self._fork(record, env):
            return
        args = ["sh", "-c", proc.SUPERVISOR_SCRIPT, "spotswarm-supervisor", str(self._exit_path(record))]
        try:
            with os.fdopen(
                os.open(record.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab"
            ) as log:
                popen = subprocess.Popen(
                    args + self._command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=str(self._cwd),
                    start_new_session=True,
                )
        except OSError as exc:
            record.gone_at, record.reported = self._clock(), True
            self._persist(record)
            self._failures.append(
                LaunchFailure(record.request_id, record.run_name, f"cannot start the worker: {exc}")
            )
            logger.warning("worker %s (run %s): spawn failed: %s", record.request_id, record.run_name, exc)
            return
        record.popen, record.pid = popen, popen.pid
        record.start_ticks = proc_start_ticks(popen.pid, include_zombies=True)
        self._persist(record)
        logger.info(
            "worker %s (run %s): started, pid %s, log %s",
            record.request_id,
            record.run_name,
            popen.pid,
            record.log_path,
        )
        threading.Thread(
            target=self._reap, args=(record, popen), name=f"reap-{record.request_id}", daemon=True
        ).start()

    def _fork(self, record: _Record, env: dict[str, str]) -> bool:
        """Start the worker from the fork server; False (after a warning) where it cannot."""
        assert self._forkserver is not None
        try:
            pid = self._forkserver.start_worker(
                {
                    "request_id": record.request_id,
                    "env": env,
                    "cwd": str(self._cwd),
                    "log_path": record.log_path,
                    "exit_path": str(self._exit_path(record)),
                    "module": WORKER_MODULE,
                    "marker": f"{LAUNCH_MARKER_ENV}={record.request_id}",
                }
            )
        except ForkServerError as exc:
            logger.warning("worker %s: %s; starting it in a fresh interpreter", record.request_id, exc)
            return False
        record.pid, record.start_ticks = pid, proc_start_ticks(pid, include_zombies=True)
        record.forked_by = self._forkserver.pid
        self._persist(record)
        logger.info(
            "worker %s (run %s): started preloaded, pid %s, log %s",
            record.request_id,
            record.run_name,
            pid,
            record.log_path,
        )
        return True

    def _forked_exit(self, pid: int, code: int) -> None:
        """The fork server saw the supervisor ``pid`` exit with ``code``."""
        with self._lock:
            for record in self._records.values():
                if record.pid == pid and record.popen is None and record.gone_at is None:
                    self._mark_gone(record, code)

    def _reap(self, record: _Record, popen: subprocess.Popen[bytes]) -> None:
        """Wait for our own child (so it never lingers as a zombie) and record how it ended."""
        code = popen.wait()
        with self._lock:
            self._mark_gone(record, code)

    def _mark_gone(self, record: _Record, code: int | None) -> None:
        record.exit_code, record.gone_at = code, self._clock()
        self._persist(record)
        logger.info(
            "worker %s (run %s, %s) %s",
            record.request_id,
            record.run_name,
            record.named_pid,
            proc.describe_exit(code),
        )
        # Its own children (hivemind's p2pd) may outlive it in the group: they have no purpose left.
        if self._owns_group(record):
            proc.signal_group(record.pid or 0, signal.SIGKILL)

    def _refresh(self) -> None:
        """Notice adopted workers (neither our children nor the fork server's) that have exited."""
        forkserver = self._forkserver.pid if self._forkserver is not None else None
        for record in self._records.values():
            if record.alive and record.agent_pid is None and record.pid is not None:
                record.agent_pid = proc.only_child(record.pid)
                if record.agent_pid is not None:
                    self._persist(record)
            if record.popen is not None or not record.alive or record.pid is None:
                continue
            if record.forked_by is not None and record.forked_by == forkserver:
                continue  # the fork server reports its exit, with the code a killed supervisor cannot write
            if proc_start_ticks(record.pid) != record.start_ticks:
                self._mark_gone(record, proc.read_exit_file(self._exit_path(record)))

    def _owns_group(self, record: _Record) -> bool:
        """True if signalling the group ``record.pid`` reaches this worker and nobody else."""
        if record.pid is None:
            return False
        if record.alive and proc_start_ticks(record.pid, include_zombies=True) == record.start_ticks:
            return True
        # The leader is gone, so its PID may be reused: trust the group only if its members carry our marker.
        members = proc.processes_with_marker(LAUNCH_MARKER_ENV, record.request_id)
        return any(pgid == record.pid for _, pgid in members)

    def _schedule_escalation(self, record: _Record, delay_s: float) -> None:
        if record.request_id in self._escalations:
            return
        timer = threading.Timer(max(0.0, delay_s), self._escalate, args=(record.request_id,))
        timer.daemon = True
        self._escalations[record.request_id] = timer
        timer.start()

    def _escalate(self, request_id: str) -> None:
        with self._lock:
            self._escalations.pop(request_id, None)
            record = self._records.get(request_id)
            if record is not None and record.pid is not None and self._owns_group(record):
                logger.warning(
                    "worker %s (run %s, pid %s): still running after %.0f s, SIGKILL",
                    request_id,
                    record.run_name,
                    record.pid,
                    self._grace_s,
                )
                proc.signal_group(record.pid, signal.SIGKILL)

    # -- state files -----------------------------------------------------------------------------

    def _state_path(self, request_id: str) -> Path:
        return self._state_dir / f"{request_id}.json"

    def _exit_path(self, record: _Record) -> Path:
        return self._state_dir / f"{record.request_id}.exit"

    def _persist(self, record: _Record) -> None:
        files.write_atomic(self._state_path(record.request_id), json.dumps(record.to_json(), sort_keys=True))

    def _reserve(self, record: _Record) -> bool:
        """Create the state file before spawning, so that one request id is spawned at most once."""
        return files.create_atomic(
            self._state_path(record.request_id), json.dumps(record.to_json(), sort_keys=True)
        )

    def _load(self, request_id: str) -> _Record | None:
        """Adopt a request recorded by an earlier launcher on this data dir (one launcher at a time)."""
        path = self._state_path(request_id)
        try:
            record = _Record.from_json(json.loads(path.read_text()))
        except FileNotFoundError:
            return None
        if record.pid is None and record.gone_at is None:
            self._find_interrupted_launch(record)
        self._records[request_id] = record
        if record.alive and proc_start_ticks(record.pid or 0) != record.start_ticks:
            self._mark_gone(record, proc.read_exit_file(self._exit_path(record)))
        if record.alive and record.terminate_requested_at is not None:
            elapsed_s = self._clock() - record.terminate_requested_at
            self._schedule_escalation(record, self._grace_s - elapsed_s)
        return record

    def _find_interrupted_launch(self, record: _Record) -> None:
        """A launcher died between spawning and recording the PID: find the worker by its env marker."""
        leaders = [
            pid
            for pid, pgid in proc.processes_with_marker(LAUNCH_MARKER_ENV, record.request_id)
            if pid == pgid
        ]
        pid = leaders[0] if leaders else None
        if pid is not None:
            record.pid, record.start_ticks = pid, proc_start_ticks(pid)
        else:
            record.gone_at = self._clock()
        self._persist(record)

    def _adopt_existing(self) -> None:
        for path in sorted(self._state_dir.glob("*.json")):
            record = self._load(path.stem)
            if record is not None and record.alive:
                logger.info(
                    "adopted worker %s (run %s, pid %s)", record.request_id, record.run_name, record.pid
                )

    def _prune(self) -> None:
        now = self._clock()
        for request_id, record in list(self._records.items()):
            if record.reported and record.gone_at is not None and now - record.gone_at > self._keep_gone_s:
                for path in (self._state_path(request_id), self._exit_path(record)):
                    path.unlink(missing_ok=True)
                del self._records[request_id]

    # -- views -----------------------------------------------------------------------------------

    def _instance(self, record: _Record) -> Instance:
        details = {
            "exit_code": record.exit_code,
            "log_path": record.log_path,
            "launched_at": record.launched_at,
            "terminating": record.terminate_requested_at is not None,
        }
        if record.machine is not None:  # one of several peers on a machine
            details.update({MACHINE_DETAIL: record.machine, PEER_INDEX_DETAIL: record.peer_index})
        return Instance(record.request_id, str(record.pid or ""), record.run_name, record.alive, details)

    def _failure(self, record: _Record) -> LaunchFailure:
        tail = proc.log_tail(Path(record.log_path))
        how = proc.describe_exit(record.exit_code)
        reason = f"worker {record.request_id} ({record.named_pid}) {how}; log: {tail}"
        retryable = record.exit_code not in PERMANENT_EXIT_CODES
        return LaunchFailure(record.request_id, record.run_name, reason[:4000], retryable)
