"""Start a real orchestrator (`spotswarm serve` in its own process group) for a test, and the settings
presets every orchestrator of the tests starts with (here or in-process: ``tests/support/inprocess.py``).

Most modules use the module-scoped ``served_orch`` fixture of ``tests/conftest.py`` (settings from the
module's ``ORCHESTRATOR_ENV``) or its ``orchestrator_factory``; a test that restarts or kills the server
calls ``start_orchestrator`` itself::

    def test_something(processes, tmp_path):
        orch = start_orchestrator(processes, tmp_path / "orch", extra_env=HAND_ONLY)
        with orch.admin() as http:
            http.post(api.runs(), json={...})

``start_orchestrator`` picks free ports (HTTP and DHT, the DHT on 127.0.0.1), waits until ``/readyz``
answers 200 and returns an :class:`Orchestrator` with its URL and admin token. Pass the same
``data_dir`` (and ``dht_port``) again to restart it on the same state. ``db_url`` selects PostgreSQL
(use the ``postgres_url`` fixture); the default is SQLite in the data dir. The settings in
:data:`TEST_ENV` make it tick fast; ``extra_env`` overrides any of them (``SPOTSWARM_*`` variables).
The ``processes`` registry kills the server (and its DHT daemon) when the test ends.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from orchestrator.db.session import Database
from tests.support import api
from tests.support.ports import PORT_ATTEMPTS, free_port, port_was_taken
from tests.support.processes import VENV_BIN, ManagedProcess, ProcessRegistry
from tests.support.waiting import wait_until

# Fast time scales for tests (production defaults: 5 s heartbeats, 10 s samples, 5 s DHT reads).
TEST_ENV: dict[str, str] = {
    "SPOTSWARM_HEARTBEAT_INTERVAL_S": "1",
    "SPOTSWARM_HEARTBEAT_TIMEOUT_S": "10",
    "SPOTSWARM_HEARTBEAT_FLUSH_INTERVAL_S": "0.2",
    "SPOTSWARM_PROGRESS_SAMPLE_INTERVAL_S": "0.5",
    "SPOTSWARM_DHT_REFRESH_INTERVAL_S": "1",
    "SPOTSWARM_DHT_TIMEOUT_S": "5",
    "SPOTSWARM_LOG_LEVEL": "info",
}

# For tests that join workers by hand: no reconcile loop (it would launch real workers for their runs).
NO_RECONCILE: dict[str, str] = {"SPOTSWARM_RECONCILE": "false"}

# Workers joined by hand, and no import probe either (it has its own tests).
HAND_ONLY: dict[str, str] = {**NO_RECONCILE, "SPOTSWARM_CHECK_IMPORTS": "false"}

# The reconcile loop on a short time scale (production: 2 s ticks, 30 s heartbeat timeout, 180 s launch).
LOOP_ENV: dict[str, str] = {
    "SPOTSWARM_RECONCILE": "true",
    "SPOTSWARM_RECONCILE_INTERVAL_S": "0.5",
    "SPOTSWARM_HEARTBEAT_TIMEOUT_S": "20",
    "SPOTSWARM_LAUNCH_TIMEOUT_S": "150",
    "SPOTSWARM_RETIRE_GRACE_S": "20",
    "SPOTSWARM_LAUNCH_BACKOFF_BASE_S": "0.5",
    "SPOTSWARM_LAUNCH_BACKOFF_CAP_S": "2",
}


class ApiServer:
    """What an orchestrator handle offers the tests, in a subprocess (:class:`Orchestrator`) or in this
    process (:class:`~tests.support.inprocess.InProcessOrchestrator`): clients on its API and its
    database, opened beside it (to write what a launcher or a past version wrote)."""

    url: str
    admin_token: str
    transport: httpx.BaseTransport | None

    def database_url(self) -> str:
        raise NotImplementedError

    def client(self, token: str | None = None, timeout_s: float = 30.0, **kwargs: Any) -> httpx.Client:
        """An HTTP client on the orchestrator, sending ``token`` as bearer token when given."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(
            transport=self.transport, base_url=self.url, headers=headers, timeout=timeout_s, **kwargs
        )

    def admin(self) -> httpx.Client:
        """An HTTP client with the admin token."""
        return self.client(self.admin_token)

    def peers(self) -> list[str]:
        """The orchestrator's DHT multiaddrs (``GET /api/v1/peers``)."""
        with self.client() as http:
            response = http.get(api.peers())
            response.raise_for_status()
            return list(response.json()["orchestrator_peers"])

    @contextmanager
    def database(self) -> Iterator[Database]:
        db = Database(self.database_url())
        try:
            yield db
        finally:
            db.close()


# The fuzzer's server: hand-joined workers, no import checks (generated import paths would all fail them
# and hide the database layer), small bodies, quiet logs.
FUZZ_ENV: dict[str, str] = {
    **HAND_ONLY,
    "SPOTSWARM_MAX_BODY_BYTES": "65536",
    "SPOTSWARM_CHECKPOINT_MAX_BYTES": "1048576",
    "SPOTSWARM_LOG_LEVEL": "warning",
}


@dataclass
class Orchestrator(ApiServer):
    """A running `spotswarm serve`: where it listens, its admin token and its process."""

    url: str
    admin_token: str
    proc: ManagedProcess
    data_dir: Path
    port: int
    dht_port: int
    db_url: str | None
    transport: httpx.BaseTransport | None = None  # over the network

    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{self.data_dir / 'spotswarm.db'}"

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """Graceful stop (SIGTERM to the group, SIGKILL after ``timeout_s``); returns the exit code."""
        return self.proc.terminate(timeout_s)

    def kill(self) -> None:
        """SIGKILL the server and its children, as a crash would."""
        self.proc.kill()


def start_orchestrator(
    processes: ProcessRegistry,
    data_dir: Path,
    db_url: str | None = None,
    extra_env: Mapping[str, str] | None = None,
    *,
    admin_token: str | None = None,
    port: int | None = None,
    dht_port: int | None = None,
    name: str = "orchestrator",
    ready_timeout_s: float = 150.0,
    command_prefix: Sequence[str] = (),
    preloaded: bool = True,
) -> Orchestrator:
    """Start `spotswarm serve` and wait until it is ready; raises TimeoutError with its log otherwise.

    With ``preloaded`` (the default, unless there is a ``command_prefix``) the server is forked with its
    imports done (:mod:`tests.support.preloaded`: seconds of CPU less per start); without, it is exec'd
    as a user starts it, as the tests of the server's process itself need it (its signals, its exit).

    Without ``admin_token`` the server generates one into ``data_dir/admin_token`` (and keeps it across
    restarts on the same data dir); it is read from there. ``command_prefix`` runs the server under a
    program that execs it (e.g. ``prlimit --nofile=...``), so the process is still the server's.

    When it chose the ports itself (neither ``port`` nor ``dht_port`` given) and one was taken before
    the server bound it, the server is started again on new ones (:mod:`tests.support.ports`).
    """
    chosen_here = port is None and dht_port is None
    for attempt in range(1, PORT_ATTEMPTS + 1):
        server_port, server_dht_port = port or free_port(), dht_port or free_port()
        try:
            return _start_once(
                processes,
                data_dir,
                db_url,
                extra_env,
                admin_token=admin_token,
                port=server_port,
                dht_port=server_dht_port,
                name=name if attempt == 1 else f"{name}-ports-{attempt}",
                ready_timeout_s=ready_timeout_s,
                command_prefix=command_prefix,
                preloaded=preloaded and not command_prefix,
            )
        except PortTaken:
            if not chosen_here or attempt == PORT_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


class PortTaken(RuntimeError):
    """The server exited at start because a port it was given was in use."""


def _start_once(
    processes: ProcessRegistry,
    data_dir: Path,
    db_url: str | None,
    extra_env: Mapping[str, str] | None,
    *,
    admin_token: str | None,
    port: int,
    dht_port: int,
    name: str,
    ready_timeout_s: float,
    command_prefix: Sequence[str],
    preloaded: bool,
) -> Orchestrator:
    env = {
        **TEST_ENV,
        "SPOTSWARM_HOST": "127.0.0.1",
        "SPOTSWARM_PORT": str(port),
        "SPOTSWARM_DATA_DIR": str(data_dir),
        "SPOTSWARM_DHT_PORT": str(dht_port),
        "SPOTSWARM_DHT_HOST_MADDRS": f"/ip4/127.0.0.1/tcp/{dht_port}",
        **({"SPOTSWARM_DATABASE_URL": db_url} if db_url else {}),
        **({"SPOTSWARM_ADMIN_TOKEN": admin_token} if admin_token else {}),
        **(extra_env or {}),
    }
    proc = processes.start(
        name, [*command_prefix, str(VENV_BIN / "spotswarm"), "serve"], env=env, preloaded=preloaded
    )
    url = f"http://127.0.0.1:{port}"

    def ready_or_gone() -> bool:
        return not proc.alive() or httpx.get(f"{url}/readyz", timeout=5).status_code == 200

    try:
        wait_until(ready_or_gone, ready_timeout_s, interval_s=0.3, message=f"{url}/readyz")
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}\n--- orchestrator log ---\n{proc.log()[-4000:]}") from exc
    if not proc.alive():  # at once, not at the deadline
        proc.popen.wait(timeout=10)
        proc.kill()  # its whole group, a DHT peer it started included
        log = proc.log()
        error = PortTaken if port_was_taken(log) else RuntimeError
        raise error(f"orchestrator exited with {proc.popen.returncode}:\n{log[-4000:]}")
    token = admin_token or (data_dir / "admin_token").read_text().strip()
    return Orchestrator(url, token, proc, data_dir, port, dht_port, db_url)


class OrchestratorFactory(Protocol):
    """Starts ``spotswarm serve`` with ``env`` (``SPOTSWARM_*`` settings) on SQLite or on a fresh database
    of the throwaway PostgreSQL cluster (``backend="postgres"``); more keywords go to
    :func:`~tests.support.orchestrator.start_orchestrator`."""

    def __call__(
        self, env: Mapping[str, str] = ..., *, backend: str = "sqlite", **kwargs: Any
    ) -> Orchestrator: ...
