"""An orchestrator to fuzz: `spotswarm serve` on SQLite or on a private PostgreSQL, no reconcile loop.

Shared by the bounded fuzz test (tests/integration/test_api_fuzz.py) and the long run
(``python bench/fuzz_api.py``). Import checks are off: nearly every generated import path fails them,
which would hide the database layer from the fuzzer (the import check has its own tests).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.orchestrator import NO_RECONCILE, Orchestrator, start_orchestrator
from tests.support.postgres import PostgresCluster
from tests.support.processes import ProcessRegistry

FUZZ_ENV = {
    **NO_RECONCILE,
    "SPOTSWARM_CHECK_IMPORTS": "false",
    "SPOTSWARM_MAX_BODY_BYTES": "65536",
    "SPOTSWARM_CHECKPOINT_MAX_BYTES": "1048576",
    "SPOTSWARM_LOG_LEVEL": "warning",
}


@contextmanager
def fuzz_orchestrator(
    root: Path, postgres: bool | PostgresCluster = False, public_reads: bool = False
) -> Iterator[Orchestrator]:
    """Start the server under ``root`` (and a PostgreSQL cluster when ``postgres`` is True; pass a running
    cluster to use it instead); everything started here is stopped on exit."""
    registry = ProcessRegistry(root)
    own_cluster = PostgresCluster() if postgres is True else None
    cluster = own_cluster or (postgres if isinstance(postgres, PostgresCluster) else None)
    try:
        if own_cluster is not None:
            own_cluster.start()
        db_url = cluster.create_database(f"fuzz_{root.name.replace('-', '_').lower()}") if cluster else None
        env = {**FUZZ_ENV, "SPOTSWARM_PUBLIC_READS": "true" if public_reads else "false"}
        yield start_orchestrator(registry, root / "data", db_url, extra_env=env)
    finally:
        registry.kill_all()
        if own_cluster is not None:
            own_cluster.stop()
