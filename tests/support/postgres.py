"""A throwaway PostgreSQL 15 cluster for the test run: initdb in a temp dir, pg_ctl on a free port."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.ports import free_port

PG_BIN = Path(os.environ.get("SPOTSWARM_PG_BIN", "/usr/lib/postgresql/15/bin"))


class PostgresCluster:
    """Starts a private cluster owned by the ``postgres`` user (when run as root) and stops it."""

    def __init__(self) -> None:
        if not (PG_BIN / "initdb").exists():
            raise RuntimeError(f"PostgreSQL binaries not found in {PG_BIN}; install postgresql-15")
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="spotswarm-pg-"))
        self.datadir = self.root / "data"
        self._as_root = os.geteuid() == 0
        if self._as_root:
            shutil.chown(self.root, user="postgres", group="postgres")
            os.chmod(self.root, 0o700)

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
        to that one) and return its SQLAlchemy URL (psycopg 3 driver)."""
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
    """A cluster started here and stopped on exit: the session's shared one (``postgres_cluster``) or a
    test's own (``own_postgres_cluster``, for tests that stop and start it)."""
    cluster = PostgresCluster()
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
