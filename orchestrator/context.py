"""What a running orchestrator is made of, handed to routes: :class:`AppContext`.

``create_app`` (``orchestrator/app.py``) builds one in its lifespan, after the database and the DHT are
up, and stores it on ``app.state.ctx``; it also makes the background services from its parts.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orchestrator.clock import Clock
from orchestrator.config import Settings
from orchestrator.db.batch import TransactionBatcher
from orchestrator.db.session import Database
from orchestrator.domain.checkpoints import UploadSlots
from orchestrator.domain.crash_budget import CrashPolicy
from orchestrator.domain.packages import PackageClaims
from orchestrator.domain.states import UNENDED_WORKER_STATES
from orchestrator.heartbeats.hub import HeartbeatHub
from orchestrator.heartbeats.writer import HeartbeatWriter
from orchestrator.importcheck.checker import ImportChecker
from orchestrator.launchers.base import Launcher
from orchestrator.progress import Forwarder, SwarmProgressCache
from orchestrator.ratelimit import RateLimiter
from orchestrator.storage.base import CheckpointStore
from orchestrator.swarm.dht import DHTPeer, DHTUnavailable, refresh_progress

if TYPE_CHECKING:
    from orchestrator.swarm.admission import SwarmAdmission

logger = logging.getLogger(__name__)


@dataclass
class AppContext:
    """Shared, long-lived parts of the orchestrator. ``launchers`` is keyed by launcher name."""

    settings: Settings
    db: Database
    clock: Clock
    dht: DHTPeer
    swarm: SwarmProgressCache
    hub: HeartbeatHub
    heartbeat_writer: HeartbeatWriter
    store: CheckpointStore
    imports: ImportChecker | None
    admin_token_hash: str
    launchers: Mapping[str, Launcher] = field(default_factory=dict)
    swarm_admission: SwarmAdmission | None = None  # None: peers join swarms without tokens
    join_limiter: RateLimiter | None = None  # registrations per join token (None: unlimited)
    uploads: UploadSlots = field(default_factory=UploadSlots)  # checkpoint uploads in progress
    package_claims: PackageClaims = field(default_factory=PackageClaims)  # packages creates are checking
    forwarder: Forwarder | None = None  # progress samples to TensorBoard (tensorboard_dir)
    # registrations arriving together share a transaction (one run-row lock, one commit)
    registrations: TransactionBatcher = field(init=False)

    def __post_init__(self) -> None:
        self.registrations = TransactionBatcher(self.db)

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
            refresh_progress(self.dht, self.swarm, swarms, self.settings.dht.timeout_s, self.clock)
        except DHTUnavailable as exc:
            logger.warning("swarm %s: could not read its progress now: %s", run.swarm_id, exc)

    def settle_heartbeats(self, worker_id: int) -> None:
        """Write what a leaving worker reported before its leaving is recorded (blocking: call it off the
        event loop). A worker that reached its run's target leaves at once: the periodic DHT reader may
        not have seen that epoch. Its DHT peer still runs while it deregisters, so the swarm is read now
        when it claims more than the DHT showed (the claim itself never counts: runs.swarm_progress).
        Then its buffered last heartbeat and that epoch are written, so both count when its leaving
        settles the run."""
        entry = self.hub.cached(worker_id)
        live = entry is not None and entry.state in UNENDED_WORKER_STATES
        if entry is not None and live and entry.epoch > self.hub.swarm_epoch(entry.run_id):
            self.read_swarm_now(entry.run_id)
        self.heartbeat_writer.flush()

    def orchestrator_peers(self) -> list[str]:
        """The DHT's visible multiaddrs, then announce addresses completed with the peer id."""
        visible = self.dht.visible_maddrs
        peer_ids = {m.rsplit("/p2p/", 1)[1] for m in visible if "/p2p/" in m}
        extra = []
        for maddr in self.settings.dht.announce_maddrs:
            if "/p2p/" in maddr or not peer_ids:
                extra.append(maddr)
            else:
                extra.extend(f"{maddr}/p2p/{peer_id}" for peer_id in sorted(peer_ids))
        return list(dict.fromkeys([*extra, *visible]))

    @property
    def crash_policy(self) -> CrashPolicy:
        """The server's crash budget defaults (a run's spec may set its own budget)."""
        return CrashPolicy(self.settings.max_worker_crashes, self.settings.crash_window_s)
