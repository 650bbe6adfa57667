"""A throwaway PostgreSQL 15 cluster for the test run: initdb in a temp dir, pg_ctl on a free port.

In a run of several processes (``make test``) the controller starts the one cluster every process uses,
before it starts them (:func:`pytest_configure`): a cluster a lane started would run at the lane's
lowered priority (``tests/support/lanes.py``), and beside two busy swarm lanes its ``initdb`` once took
over a minute, failing every PostgreSQL test of that lane. Each process then prefixes the names of the
databases it creates with its own (``PostgresCluster.names_prefix``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.ports import free_port

PG_BIN = Path(os.environ.get("SPOTSWARM_PG_BIN", "/usr/lib/postgresql/15/bin"))
#: the port of the run's shared cluster, set by the controller of a run of several processes
SHARED_PORT_ENV = "SPOTSWARM_TEST_PG_PORT"
_SHARED = pytest.StashKey["PostgresCluster"]()


class PostgresCluster:
    """Starts a private cluster owned by the ``postgres`` user (when run as root) and stops it; or creates
    databases on one another process of the run started."""

    def __init__(self, port: int | None = None, names_prefix: str = "") -> None:
        """A new cluster on a free port, or (``port``) the one already running there, whose databases
        this process names with ``names_prefix`` first."""
        if not (PG_BIN / "initdb").exists():
            raise RuntimeError(f"PostgreSQL binaries not found in {PG_BIN}; install postgresql-15")
        self.port = port or free_port()
        self.names_prefix = names_prefix
        self._as_root = os.geteuid() == 0
        self._root: Path | None = None
        if port is None:  # a cluster of its own: its directory
            self._root = Path(tempfile.mkdtemp(prefix="spotswarm-pg-"))
            if self._as_root:
                shutil.chown(self._root, user="postgres", group="postgres")
                os.chmod(self._root, 0o700)

    @property
    def root(self) -> Path:
        """The cluster's directory (its data, socket and log): only a cluster started here has one."""
        if self._root is None:
            raise RuntimeError(f"the cluster on port {self.port} was started by another process")
        return self._root

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    def _run(self, *args: str) -> None:
        cmd = [str(a) for a in args]
        if self._as_root:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)

    def _server_opts(self) -> str:
        return (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c max_connections=200 -c fsync=off"
        )

    def _pg_ctl_start(self) -> None:
        log = str(self.root / "pg.log")
        self._run(
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(self.datadir),
            "-l",
            log,
            "-o",
            self._server_opts(),
            "-w",
            "-t",
            "30",
            "start",
        )

    def start(self) -> None:
        self._run(
            str(PG_BIN / "initdb"), "-D", str(self.datadir), "-U", "postgres", "-A", "trust", "-E", "UTF8"
        )
        self._pg_ctl_start()

    def stop(self) -> None:
        try:
            self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.datadir), "-m", "immediate", "-w", "stop")
        finally:
            # in a process of its own that the run does not wait for: a data dir holding the databases of a
            # whole test run takes tens of seconds to delete on a busy machine, which pytest-timeout charged
            # to the last test of a worker
            subprocess.Popen(
                ["rm", "-rf", str(self.root)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )

    def restart(self) -> None:
        """Stop and start the server on the same port and data (for reconnect tests)."""
        self.stop_server()
        self.start_server()

    def stop_server(self) -> None:
        """Stop the server (fast: clients are disconnected), keeping its data for :meth:`start_server`."""
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.datadir), "-m", "fast", "-w", "stop")

    def start_server(self) -> None:
        """Start a server stopped by :meth:`stop_server` on the same port and data."""
        self._pg_ctl_start()

    def create_database(self, name: str, template: str | None = None) -> str:
        """Create database ``name`` (a copy of database ``template`` if given: nobody may be connected
        to that one; both named as this process names them) and return its SQLAlchemy URL (psycopg 3
        driver)."""
        name = self.names_prefix + name
        template = self.names_prefix + template if template else None
        self._run(
            str(PG_BIN.parent / "bin" / "createdb"),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "postgres",
            *(("--template", template) if template else ()),
            name,
        )
        return self.url(name)

    def url(self, name: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"


@contextmanager
def running_postgres() -> Iterator[PostgresCluster]:
    """A cluster started here and stopped on exit: the session's (``postgres_cluster``) when no shared
    one runs, or a test's own (``own_postgres_cluster``, for tests that stop and start it)."""
    cluster = PostgresCluster()
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@contextmanager
def session_postgres() -> Iterator[PostgresCluster]:
    """The cluster of this process's tests: the run's shared one where its controller started one
    (databases named after this process), else one of its own, started on first use."""
    port = os.environ.get(SHARED_PORT_ENV)
    if port:
        yield PostgresCluster(int(port), names_prefix=f"p{os.getpid()}_")
        return
    with running_postgres() as cluster:
        yield cluster


def _controller_of_several(config: pytest.Config) -> bool:
    """Whether this process is the controller of a pytest-xdist run with worker processes."""
    several = bool(config.getoption("numprocesses", None)) and config.getoption("dist", "no") != "no"
    return several and not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    """The controller of a run of several processes starts the cluster they share, before it starts
    them (they inherit its port); a run inside a test's run uses the outer run's."""
    if SHARED_PORT_ENV in os.environ or not _controller_of_several(config):
        return
    cluster = PostgresCluster()
    cluster.start()
    config.stash[_SHARED] = cluster
    os.environ[SHARED_PORT_ENV] = str(cluster.port)


def pytest_unconfigure(config: pytest.Config) -> None:
    cluster = config.stash.get(_SHARED, None)
    if cluster is not None:
        os.environ.pop(SHARED_PORT_ENV, None)
        cluster.stop()
