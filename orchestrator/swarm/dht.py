"""The orchestrator's own DHT peer and the reader of each run's swarm progress.

The peer is a plain ``hivemind.DHT`` with a persistent identity (a private key file in the data dir)
on a fixed port, so its multiaddrs (``/ip4/.../tcp/<port>/p2p/<peer id>``) stay the same across
restarts: workers and users can keep them as initial peers. It runs in its own (forked) process, as
hivemind does; its calls block, so the API never calls it on the event loop: a background task reads
progress into a :class:`~orchestrator.progress.SwarmProgressCache` and the routes only read the cache.

Progress comes from what hivemind's ``ProgressTracker`` publishes for a run whose ``run_id`` is the
run's ``swarm_id``: the key ``f"{swarm_id}_progress"`` with one subkey per peer holding a
``LocalTrainingProgress`` (epoch, samples_accumulated, samples_per_second, time, client_mode).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from orchestrator.clock import Clock
from orchestrator.progress import SwarmProgress, SwarmProgressCache
from orchestrator.swarm import dht_process

logger = logging.getLogger(__name__)


class DHTUnavailable(RuntimeError):
    """The DHT peer could not start or has died."""


def progress_key(swarm_id: str) -> str:
    """The DHT key hivemind's ProgressTracker publishes a run's per-peer progress under."""
    return f"{swarm_id}_progress"


def parse_progress(metadata: Any, target_batch_size: int, read_at: datetime) -> SwarmProgress | None:
    """Aggregate one ``get(progress_key)`` result; None when no peer has a valid entry.

    The swarm epoch is the highest epoch of a non-client peer; samples count only peers at that epoch;
    throughput counts all peers (as ProgressTracker does). Malformed entries are ignored.
    """
    entries = []
    if isinstance(metadata, Mapping):
        for item in metadata.values():
            value = getattr(item, "value", None)
            if isinstance(value, Mapping) and isinstance(value.get("epoch"), int):
                entries.append(value)
    if not entries:
        return None
    trainers = [e for e in entries if not e.get("client_mode")]
    epoch = max(int(e["epoch"]) for e in (trainers or entries))
    samples = sum(int(e.get("samples_accumulated") or 0) for e in entries if e["epoch"] == epoch)
    speed = sum(float(e.get("samples_per_second") or 0.0) for e in entries)
    return SwarmProgress(
        epoch=epoch,
        samples_accumulated=samples,
        num_peers=len(entries),
        num_clients=len(entries) - len(trainers),
        samples_per_s=speed,
        target_batch_size=target_batch_size,
        read_at=read_at,
    )


class DHTPeer(Protocol):
    """What the orchestrator asks of its DHT peer (:class:`OrchestratorDHT` is the real one). Every call
    may block: make it off the event loop."""

    @property
    def visible_maddrs(self) -> list[str]:
        """Multiaddrs other peers can dial."""
        ...

    def alive(self) -> bool:
        """Whether the peer runs (``/readyz`` reports it)."""
        ...

    def read_progress(
        self, swarms: Mapping[str, int], timeout_s: float, now: Clock
    ) -> dict[str, SwarmProgress | None]:
        """Each swarm's progress (None: no record); swarms whose read failed are left out."""
        ...

    def run_coroutine(
        self, coro: Callable[[Any, Any], Awaitable[Any]], timeout_s: float | None = None
    ) -> Any:
        """Run ``coro(dht, node)`` in the peer's process; raises :class:`DHTUnavailable`."""
        ...

    def shutdown(self) -> None:
        """Stop the peer; safe to call twice."""
        ...


def refresh_progress(
    dht: DHTPeer, cache: SwarmProgressCache, swarms: Mapping[str, int], timeout_s: float, now: Clock
) -> None:
    """Read the progress of ``swarms`` (swarm id -> target batch size) into ``cache``; blocks for at most
    ``timeout_s``. Raises :class:`DHTUnavailable` when the peer is not running."""
    results = dht.read_progress(swarms, timeout_s, now)
    read_at = now()
    for swarm_id, progress in results.items():
        cache.update(swarm_id, progress, read_at)


class OrchestratorDHT:
    """A hivemind DHT peer with a stable identity. ``start`` and every read block: call them off-loop.

    Its process ends with the server, and ``pid_path`` lets the next start stop a peer that a crashed
    server left behind (:mod:`orchestrator.swarm.dht_process`).
    """

    def __init__(
        self,
        identity_path: Path,
        pid_path: Path,
        host_maddrs: list[str],
        announce_maddrs: list[str],
        dht_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.identity_path = identity_path
        self.pid_path = pid_path
        self.host_maddrs = host_maddrs
        self.announce_maddrs = announce_maddrs
        self.dht_options = dict(dht_options or {})  # more hivemind.DHT keywords (swarm admission's)
        self._dht: Any = None
        self._maddrs: list[str] = []
        # hivemind.DHT sends each call down one pipe without a lock: calls from several threads (the
        # progress reader, a leaving worker's request, the admission sync) must not interleave.
        self._send_lock = threading.Lock()

    def start(self) -> None:
        """Start the peer (forks a process, ~1-3 s). Raises :class:`DHTUnavailable` if it fails or if
        the peer of another orchestrator on the same data dir still runs."""
        from hivemind.dht.crypto import RSASignatureValidator

        self.identity_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            dht_process.stop_stale_peer(self.pid_path)
        except dht_process.StalePeerRunning as exc:
            raise DHTUnavailable(str(exc)) from exc
        kwargs: dict[str, Any] = {
            "host_maddrs": self.host_maddrs,
            "identity_path": str(self.identity_path),
            # Workers dial the orchestrator at its announced address; it never needs a router to open
            # its port (UPnP/NAT-PMP would expose the DHT beyond the network it is meant for).
            "nat_port_map": False,
        }
        if self.announce_maddrs:
            kwargs["announce_maddrs"] = self.announce_maddrs
        kwargs.update(self.dht_options)
        try:
            # The signature validator strips the signatures ProgressTracker adds to its records.
            self._dht = dht_process.start_server_dht(record_validators=[RSASignatureValidator()], **kwargs)
            self._maddrs = [str(m) for m in self._dht.get_visible_maddrs()]
        except (OSError, RuntimeError, ValueError) as exc:
            raise DHTUnavailable(f"the DHT peer did not start on {self.host_maddrs}: {exc}") from exc
        dht_process.record_peer(self.pid_path, self._dht.pid)
        logger.info("DHT peer up (pid %d): %s", self._dht.pid, ", ".join(self._maddrs))

    @property
    def visible_maddrs(self) -> list[str]:
        """Multiaddrs other peers can dial (captured at start; stable across restarts)."""
        return list(self._maddrs)

    def alive(self) -> bool:
        return self._dht is not None and bool(self._dht.is_alive())

    def read_progress(
        self, swarms: Mapping[str, int], timeout_s: float, now: Clock
    ) -> dict[str, SwarmProgress | None]:
        """Read the progress of each swarm id (-> its target batch size) within ``timeout_s`` overall.

        Swarms whose read fails or times out are left out of the result. Raises
        :class:`DHTUnavailable` when the peer is not running.
        """
        if not self.alive():
            raise DHTUnavailable("the DHT peer is not running")
        with self._send_lock:
            futures = {
                sid: self._dht.get(progress_key(sid), latest=True, return_future=True) for sid in swarms
            }
        deadline = time.monotonic() + timeout_s
        results: dict[str, SwarmProgress | None] = {}
        for swarm_id, future in futures.items():
            try:
                found = future.result(timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                future.cancel()
                logger.warning("swarm %s: DHT progress read timed out after %.1f s", swarm_id, timeout_s)
                continue
            except (OSError, RuntimeError, ValueError) as exc:
                logger.warning("swarm %s: DHT progress read failed: %s", swarm_id, exc)
                continue
            metadata = found.value if found is not None else None
            results[swarm_id] = parse_progress(metadata, swarms[swarm_id], now())
        return results

    def run_coroutine(
        self, coro: Callable[[Any, Any], Awaitable[Any]], timeout_s: float | None = None
    ) -> Any:
        """Run ``coro(dht, node)`` in the DHT's process and return its result (hivemind's
        ``run_coroutine``; ``coro`` must be picklable). Raises :class:`DHTUnavailable` when not running
        or when no result came within ``timeout_s`` (None: wait)."""
        if not self.alive():
            raise DHTUnavailable("the DHT peer is not running")
        with self._send_lock:
            future = self._dht.run_coroutine(coro, return_future=True)
        try:
            return future.result(timeout=timeout_s)
        except TimeoutError as exc:
            future.cancel()
            raise DHTUnavailable(f"the DHT peer did not answer within {timeout_s} s") from exc

    def shutdown(self) -> None:
        """Stop the peer process, within hivemind's 3 s grace plus :data:`dht_process.KILL_WAIT_S` at
        worst (then it is killed with its ``p2pd``); safe to call twice or before start."""
        dht, self._dht = self._dht, None
        if dht is None:
            return
        dht.shutdown()  # asks the peer to leave; after 3 s, SIGTERM (it leaves with its p2pd)
        dht.join(dht_process.KILL_WAIT_S)
        if dht.is_alive():
            logger.error("the DHT peer (pid %d) ignored SIGTERM: killing it", dht.pid)
            dht_process.stop_process_tree(dht.pid)
            dht.join(dht_process.KILL_WAIT_S)
        dht_process.forget_peer(self.pid_path)
