"""The ``local`` launcher in a simulated spot market: launches, notices and terminations as on EC2 spot.

:class:`SpotMarketLauncher` wraps a :class:`~orchestrator.launchers.local.LocalLauncher` and obeys a
:class:`~orchestrator.launchers.spot_market.SpotMarket`, so that the paths a spot fleet takes on EC2 run
on one machine with real workers:

- a launch when every slot the market offers is taken starts nothing and is reported by
  :meth:`poll_errors` as EC2's ``InsufficientInstanceCapacity`` is by the ``ec2`` launcher (a capacity
  failure: the reconciler asks again ever less often, and never fails the run for it);
- when the market shrinks below the workers that hold slots, the workers it reclaims are chosen by the
  market's seeded draw (logged); each gets EC2's interruption notice through its own instance metadata
  (:mod:`orchestrator.launchers.spot_imds`, which its agent polls as on EC2) and is terminated after the
  notice period, or, for the market's ``kill_share`` of reclaims, is killed with SIGKILL at once;
- a slot is a machine: with ``peers_per_machine`` a launch takes one slot for all its peers, and a
  reclaim takes the machine back from all of them at once (each gets the notice, as each peer of a
  multi-GPU instance polls that instance's metadata); a peer that ended alone frees no slot while one
  of its siblings runs;
- when it grows, launches succeed again.

The market is stepped whenever the reconcile loop looks (each :meth:`describe`, :meth:`poll_errors` and
:meth:`launch`), so its events take effect within one reconcile interval.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator.launchers.base import MACHINE_DETAIL, Instance, LaunchFailure, LaunchRequest, PeerRequest
from orchestrator.launchers.local import LocalLauncher
from orchestrator.launchers.spot_imds import LocalMetadataService
from orchestrator.launchers.spot_market import SpotMarket, SpotMarketError, SpotMarketSettings
from worker.protocol.imds import METADATA_URL_ENV

logger = logging.getLogger(__name__)

#: what EC2 answers, and so what the failure says, when no spot pool has capacity
CAPACITY_ERROR = "InsufficientInstanceCapacity"
MARKET = "spot (simulated)"


def load_market_settings(path: Path) -> SpotMarketSettings:
    """The market described by the JSON file ``path``; a relative trace path is relative to that file.

    Raises :class:`SpotMarketError` for a file that is unreadable or describes no usable market.
    """
    try:
        settings = SpotMarketSettings.model_validate_json(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SpotMarketError(f"spot market {path}: {exc}") from exc
    if settings.trace is not None and not settings.trace.is_absolute():
        settings = settings.model_copy(update={"trace": Path(path).parent / settings.trace})
    return settings


class SpotMarketLauncher:
    """A :class:`LocalLauncher` whose capacity a :class:`SpotMarket` decides; see the module docstring."""

    name = "local"

    def __init__(
        self,
        inner: LocalLauncher,
        market: SpotMarket,
        clock: Callable[[], float],
        metadata: LocalMetadataService | None = None,
    ) -> None:
        self._inner = inner
        self.market = market
        self._clock = clock
        self._metadata = metadata or LocalMetadataService()
        self._lock = threading.RLock()
        self._failures: list[LaunchFailure] = []
        self._terminate_at: dict[str, float] = {}  # reclaimed request id -> when its slot is taken back
        self._reclaimed: set[str] = set()  # machines (their first request ids)

    def validate_options(self, options: Mapping[str, Any], *, workers: int = 1) -> None:
        """As the local launcher's."""
        self._inner.validate_options(options, workers=workers)

    def peers_per_machine(self, options: Mapping[str, Any]) -> int:
        """As the local launcher's: the peers that share one slot."""
        return self._inner.peers_per_machine(options)

    def launch(self, request: LaunchRequest) -> str:
        """Start the machine's workers if the market has a free slot (or it was launched already); else
        report ``InsufficientInstanceCapacity`` for each of its peers through :meth:`poll_errors` and
        return ``""``."""
        first, *siblings = (self._with_metadata(peer) for peer in request.peers)
        request = replace(request, env=first.env, siblings=tuple(siblings))
        with self._lock:
            instances = self._step()
            if any(_machine(i) == request.request_id for i in instances):
                return self._inner.launch(request)  # idempotent: the one already started
            capacity, held = self.market.capacity(), len(self._holding(instances))
            if held >= capacity:
                reason = (
                    f"no spot capacity (local/{MARKET}: {CAPACITY_ERROR}: "
                    f"{held} of {capacity} slots taken, trace at {self.market.trace_s():.0f} s)"
                )
                logger.warning("run %s request %s: %s", request.run_name, request.request_id, reason)
                self._failures.extend(
                    LaunchFailure(peer.request_id, request.run_name, reason, capacity=True)
                    for peer in request.peers
                )
                return ""
            return self._inner.launch(request)

    def _with_metadata(self, peer: PeerRequest) -> PeerRequest:
        """The peer, told where its instance metadata is (its own "instance" on the local service)."""
        return replace(peer, env={**peer.env, METADATA_URL_ENV: self._metadata.url_for(peer.request_id)})

    def terminate(self, request_id: str) -> None:
        """As the local launcher's."""
        self._inner.terminate(request_id)

    def describe(self) -> list[Instance]:
        """The local launcher's workers, each marked as on the spot market and whether it was reclaimed."""
        with self._lock:
            return [self._marked(i) for i in self._step()]

    def poll_errors(self) -> list[LaunchFailure]:
        """Launches the market refused, then the local launcher's failures."""
        with self._lock:
            self._step()
            failures, self._failures = self._failures, []
            return failures + self._inner.poll_errors()

    def close(self) -> None:
        """Stop the metadata service and the local launcher (workers keep running, as there)."""
        self._metadata.close()
        self._inner.close()

    # -- the market ------------------------------------------------------------------------------

    def _holding(self, instances: list[Instance]) -> set[str]:
        """Machines that hold a slot: every one with a live peer that the market has not reclaimed."""
        return {_machine(i) for i in instances if i.alive and _machine(i) not in self._reclaimed}

    def _step(self) -> list[Instance]:
        """Terminate the reclaimed workers whose notice ran out; reclaim what the market took back."""
        now = self._clock()
        instances = self._inner.describe()
        alive = {i.request_id: i for i in instances if i.alive}
        for request_id, due_at in list(self._terminate_at.items()):
            if now >= due_at:
                del self._terminate_at[request_id]
                if request_id in alive:
                    logger.info("worker %s: spot notice period over; terminating it", request_id)
                    self._inner.terminate(request_id)
        if not self.market.started:
            return instances  # the trace starts at the first launch
        holding = self._holding(instances)
        excess = len(holding) - self.market.capacity()
        if excess > 0:
            for machine in self.market.draw(list(holding), excess):
                peers = [i for i in alive.values() if _machine(i) == machine]
                self._reclaim(machine, peers, now)
        return instances

    def _reclaim(self, machine: str, peers: list[Instance], now: float) -> None:
        """Take ``machine`` back from all its live ``peers``: a notice to each, or a kill -9 of each."""
        self._reclaimed.add(machine)
        trace_s, capacity = self.market.trace_s(), self.market.capacity()
        run_name, names = peers[0].run_name, ", ".join(i.request_id for i in peers)
        if self.market.kill_without_notice():
            logger.warning(
                "run %s worker %s: spot market reclaims it without notice (kill -9; trace %.0f s, %d slots)",
                run_name, names, trace_s, capacity,
            )  # fmt: skip
            for peer in peers:
                self._inner.kill(peer.request_id)
            return
        notice_s = self.market.notice_wall_s()
        logger.warning(
            "run %s worker %s: spot market reclaims it: notice, ends in %.1f s (trace %.0f s, %d slots)",
            run_name, names, notice_s, trace_s, capacity,
        )  # fmt: skip
        for peer in peers:
            self._metadata.interrupt(peer.request_id, notice_s)
            self._terminate_at[peer.request_id] = now + notice_s

    def _marked(self, instance: Instance) -> Instance:
        details = {
            **instance.details,
            "market": MARKET,
            "interrupted": _machine(instance) in self._reclaimed,
        }
        return replace(instance, details=details)


def _machine(instance: Instance) -> str:
    """The machine of a worker: its first peer's request id (its own, alone on its machine)."""
    return str(instance.details.get(MACHINE_DETAIL, instance.request_id))
