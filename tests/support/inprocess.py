"""The orchestrator in the test's own process: ``create_app`` with a null DHT, reached through httpx's ASGI
transport, its lifespan run as ``spotswarm serve`` runs it (database migrated, heartbeat hub, background
services). No port, no subprocess, no DHT process: a start takes a fraction of a second, so each test gets
its own app and its own database.

Usage (``tests/api/conftest.py`` has the fixtures)::

    with inprocess_orchestrator(tmp_path / "data", env=HAND_ONLY) as orch:
        with orch.admin() as http:
            http.post(api.runs(), json=run_spec("r"))

The app runs on an event loop in a thread of its own (an anyio blocking portal); the clients are plain
synchronous ``httpx.Client`` objects whose transport hands each request to that loop, so tests read as
they do against a real server (threads may send requests at once). A request body given as an iterator is
read off the loop, one chunk at a time, as a socket would deliver it. Settings come from the same
``SPOTSWARM_*`` presets as the subprocess fixture's (``tests/support/orchestrator.py``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import anyio
import anyio.to_thread

# `spotswarm serve` has hivemind imported once its DHT peer starts; the null DHT never imports it, so the
# first heartbeat that announces addresses (parsed with hivemind's multiaddr) would pay for the import,
# seconds, inside a request whose time the test measures against a heartbeat timeout.
import hivemind.utils.multiaddr  # noqa: F401  (loaded once, here)
import httpx
from anyio.from_thread import BlockingPortal, start_blocking_portal
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from sqlalchemy.engine import make_url

from orchestrator.app import create_app
from orchestrator.config import ENV_PREFIX, Settings
from orchestrator.db.session import Database
from orchestrator.swarm.admission import load_or_create_key
from tests.support.null_dht import null_dht
from tests.support.orchestrator import TEST_ENV, ApiServer

BASE_URL = "http://localhost"  # a host the API answers to (trusted_hosts)
LIFESPAN_TIMEOUT_S = 60.0  # start-up migrates the database; shut-down writes the last heartbeats


def settings_from_env(env: Mapping[str, str]) -> Settings:
    """Settings as ``spotswarm serve`` reads them from ``env`` (``SPOTSWARM_*`` variables) alone: any
    ``SPOTSWARM_*`` variable of this process is left out."""
    ours = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    with mock.patch.dict(os.environ, {**ours, **env}, clear=True):
        return Settings()


class _ChunksOffTheLoop(httpx.AsyncByteStream):
    """A request body read in a worker thread, chunk by chunk, so a slow producer never blocks the loop."""

    def __init__(self, stream: httpx.SyncByteStream | httpx.AsyncByteStream) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if isinstance(self._stream, httpx.AsyncByteStream):
            async for chunk in self._stream:
                yield chunk
            return
        chunks = iter(self._stream)
        while (piece := await anyio.to_thread.run_sync(_next_chunk, chunks)) is not None:
            yield piece


def _next_chunk(chunks: Iterator[bytes]) -> bytes | None:
    return next(chunks, None)


class PortalTransport(httpx.BaseTransport):
    """A synchronous transport that sends each request to ``app`` on the portal's event loop."""

    def __init__(self, app: FastAPI, portal: BlockingPortal) -> None:
        self._asgi = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
        self._portal = portal

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        forwarded = httpx.Request(
            request.method,
            request.url,
            headers=request.headers,
            stream=_ChunksOffTheLoop(request.stream),
            extensions=request.extensions,
        )
        status, headers, raw = self._portal.call(self._send, forwarded)
        return httpx.Response(status, headers=headers, stream=httpx.ByteStream(raw), request=request)

    async def _send(self, request: httpx.Request) -> tuple[int, httpx.Headers, bytes]:
        response = await self._asgi.handle_async_request(request)
        raw = b"".join([chunk async for chunk in response.stream])  # type: ignore[union-attr]
        return response.status_code, response.headers, raw


@dataclass
class InProcessOrchestrator(ApiServer):
    """A running app in this process: its settings, admin token and clients (as the subprocess fixture's
    :class:`~tests.support.orchestrator.Orchestrator` offers them)."""

    app: FastAPI
    settings: Settings
    admin_token: str
    transport: PortalTransport
    url: str = BASE_URL

    @property
    def data_dir(self) -> Path:
        return self.settings.data_dir

    @property
    def db_url(self) -> str | None:
        return self.settings.database_url

    def database_url(self) -> str:
        return self.settings.resolved_database_url()


def migrated_database(url: str) -> str:
    """Bring the database at ``url`` to the newest migration, close every connection, return ``url``."""
    database = Database(url)
    try:
        database.upgrade()
    finally:
        database.close()
    return url


@dataclass(frozen=True)
class SeedFiles:
    """What a data dir holds once an orchestrator has run on it, made once in ``root`` as the server
    makes them: a SQLite database at the newest migration and a swarm authority key."""

    sqlite_db: Path
    authority_key: Path

    @classmethod
    def create(cls, root: Path) -> SeedFiles:
        sqlite_db, authority_key = _default_files(root)
        migrated_database(f"sqlite:///{sqlite_db}")
        if sqlite_db.with_name(sqlite_db.name + "-wal").exists():
            raise RuntimeError(f"{sqlite_db} kept its write-ahead log after its last connection closed")
        load_or_create_key(authority_key)
        return cls(sqlite_db, authority_key)


def seed_data_dir(data_dir: Path, seed: SeedFiles, *, sqlite: bool) -> Path:
    """``data_dir`` as a restart finds it: the seed's authority key and, with ``sqlite``, its database.
    Start-up then migrates nothing and makes no key (what a first start does is the subprocess tests'
    part). Returns ``data_dir``."""
    data_dir.mkdir(parents=True, exist_ok=True)
    sqlite_db, key_path = _default_files(data_dir)
    shutil.copy(seed.authority_key, key_path)  # with its mode (0600)
    if sqlite:
        shutil.copyfile(seed.sqlite_db, sqlite_db)
    return data_dir


def _default_files(data_dir: Path) -> tuple[Path, Path]:
    """Where an orchestrator on ``data_dir`` keeps its SQLite database and its swarm authority key."""
    settings = settings_from_env({"SPOTSWARM_DATA_DIR": str(data_dir)})
    database = make_url(settings.resolved_database_url()).database
    assert database, settings.resolved_database_url()
    return Path(database), settings.swarm_authority_key_path()


@asynccontextmanager
async def _running(app: FastAPI) -> AsyncIterator[None]:
    """The app's lifespan (entered on the portal's loop: the manager needs a running loop)."""
    async with LifespanManager(app, startup_timeout=LIFESPAN_TIMEOUT_S, shutdown_timeout=LIFESPAN_TIMEOUT_S):
        yield


@contextmanager
def inprocess_orchestrator(
    data_dir: Path,
    db_url: str | None = None,
    env: Mapping[str, str] | None = None,
    *,
    admin_token: str = "ssa_in-process-admin-token",
    **create_app_kwargs: Any,
) -> Iterator[InProcessOrchestrator]:
    """Build the app on :data:`TEST_ENV` plus ``env``, run its lifespan, yield it; stopped on exit.

    ``create_app_kwargs`` go to :func:`create_app` (``launchers``, ``store``, ``clock``); the DHT is a
    :class:`~tests.support.null_dht.NullDHT` unless ``dht_factory`` is given.
    """
    settings = settings_from_env(
        {
            **TEST_ENV,
            "SPOTSWARM_DATA_DIR": str(data_dir),
            "SPOTSWARM_ADMIN_TOKEN": admin_token,
            **({"SPOTSWARM_DATABASE_URL": db_url} if db_url else {}),
            **(env or {}),
        }
    )
    create_app_kwargs.setdefault("dht_factory", null_dht)
    app = create_app(settings, **create_app_kwargs)
    with start_blocking_portal() as portal, portal.wrap_async_context_manager(_running(app)):
        yield InProcessOrchestrator(app, settings, admin_token, PortalTransport(app, portal))
