"""What a running orchestrator is made of, handed to routes and background services alike.

``create_app`` builds one :class:`AppContext` in its lifespan (after the database and the DHT are up)
and stores it on ``app.state.ctx``. A background service (the heartbeat flusher, the DHT progress
reader, later the reconciler) is made by a factory ``(ctx) -> BackgroundService`` passed to
``create_app(services=[...])``, started after the built-in ones and stopped before them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from orchestrator.clock import Clock
from orchestrator.config import Settings
from orchestrator.db.session import Database
from orchestrator.domain.checkpoints import UploadSlots
from orchestrator.domain.crash_budget import CrashPolicy
from orchestrator.heartbeats.hub import HeartbeatHub
from orchestrator.importcheck.checker import ImportChecker
from orchestrator.launchers.base import Launcher
from orchestrator.metrics.tensorboard import Forwarder
from orchestrator.ratelimit import RateLimiter
from orchestrator.storage.base import CheckpointStore
from orchestrator.swarm.admission import SwarmAdmission
from orchestrator.swarm.dht import DHTUnavailable, OrchestratorDHT, SwarmProgressCache, refresh_progress

logger = logging.getLogger(__name__)


@dataclass
class AppContext:
    """Shared, long-lived parts of the orchestrator. ``launchers`` is keyed by launcher name."""

    settings: Settings
    db: Database
    clock: Clock
    dht: OrchestratorDHT
    swarm: SwarmProgressCache
    hub: HeartbeatHub
    store: CheckpointStore
    imports: ImportChecker | None
    admin_token_hash: str
    launchers: Mapping[str, Launcher] = field(default_factory=dict)
    swarm_admission: SwarmAdmission | None = None  # None: peers join swarms without tokens
    join_limiter: RateLimiter | None = None  # registrations per join token (None: unlimited)
    uploads: UploadSlots = field(default_factory=UploadSlots)  # checkpoint uploads in progress
    forwarder: Forwarder | None = None  # progress samples to TensorBoard (tensorboard_dir)

    def read_swarm_now(self, run_id: int) -> None:
        """Read one active run's swarm progress from the DHT now, into the progress cache (blocking, at
        most ``dht_timeout_s``; call it off the event loop). Used where a worker claims an epoch the
        periodic reader has not seen yet, while the worker's own DHT peer may still hold the record:
        as it leaves, or as it uploads a checkpoint. A DHT that does not answer is logged, not raised.
        """
        run = self.hub.run_entry(run_id)
        if run is None:
            return
        swarms = {run.swarm_id: run.target_batch_size}
        try:
            refresh_progress(self.dht, self.swarm, swarms, self.settings.dht_timeout_s, self.clock)
        except DHTUnavailable as exc:
            logger.warning("swarm %s: could not read its progress now: %s", run.swarm_id, exc)

    def orchestrator_peers(self) -> list[str]:
        """The DHT's visible multiaddrs, then announce addresses completed with the peer id."""
        visible = self.dht.visible_maddrs
        peer_ids = {m.rsplit("/p2p/", 1)[1] for m in visible if "/p2p/" in m}
        extra = []
        for maddr in self.settings.dht_announce_maddrs:
            if "/p2p/" in maddr or not peer_ids:
                extra.append(maddr)
            else:
                extra.extend(f"{maddr}/p2p/{peer_id}" for peer_id in sorted(peer_ids))
        return list(dict.fromkeys([*extra, *visible]))

    @property
    def crash_policy(self) -> CrashPolicy:
        """The server's crash budget defaults (a run's spec may set its own budget)."""
        return CrashPolicy(self.settings.max_worker_crashes, self.settings.crash_window_s)


class BackgroundService(Protocol):
    """Something that runs beside the API for the server's lifetime."""

    name: str

    async def start(self) -> None:
        """Begin work (return quickly: spawn a task)."""
        ...

    async def stop(self) -> None:
        """Finish work and release resources; must not raise for an already stopped service."""
        ...


ServiceFactory = Callable[[AppContext], BackgroundService]


class PeriodicService:
    """Calls a blocking ``tick`` in a worker thread every ``interval_s`` (and once more at stop if asked).

    A tick that raises is logged with its traceback and the loop goes on: a database hiccup must not
    end the flusher for good. Ticks never overlap.
    """

    def __init__(
        self, name: str, interval_s: float, tick: Callable[[], object], final_tick: bool = False
    ) -> None:
        self.name = name
        self.interval_s = interval_s
        self._tick = tick
        self._final_tick = final_tick
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=self.name)

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            await self._run_once()
            try:
                await asyncio.wait_for(self._stopping.wait(), timeout=self.interval_s)
            except asyncio.TimeoutError:
                pass

    async def _run_once(self) -> None:
        try:
            await asyncio.to_thread(self._tick)
        except Exception:  # noqa: BLE001 - logged with traceback; the loop must survive one bad tick
            logger.exception("%s: tick failed", self.name)

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            await self._task
            self._task = None
            if self._final_tick:
                await self._run_once()
