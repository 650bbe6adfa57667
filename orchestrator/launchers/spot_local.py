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

from orchestrator.launchers.base import Instance, LaunchFailure, LaunchRequest
from orchestrator.launchers.local import LocalLauncher
from orchestrator.launchers.spot_imds import LocalMetadataService
from orchestrator.launchers.spot_market import SpotMarket, SpotMarketError, SpotMarketSettings
from worker.agent.spot import METADATA_URL_ENV

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
        self._reclaimed: set[str] = set()

    def validate_options(self, options: Mapping[str, Any], *, workers: int = 1) -> None:
        """As the local launcher's."""
        self._inner.validate_options(options, workers=workers)

    def launch(self, request: LaunchRequest) -> str:
        """Start the worker if the market has a free slot (or it was launched already); else report
        ``InsufficientInstanceCapacity`` through :meth:`poll_errors` and return ``""``."""
        with self._lock:
            instances = self._step()
            if any(i.request_id == request.request_id for i in instances):
                return self._inner.launch(request)  # idempotent: the one already started
            capacity, held = self.market.capacity(), len(self._holding(instances))
            if held >= capacity:
                reason = (
                    f"no spot capacity (local/{MARKET}: {CAPACITY_ERROR}: "
                    f"{held} of {capacity} slots taken, trace at {self.market.trace_s():.0f} s)"
                )
                logger.warning("run %s request %s: %s", request.run_name, request.request_id, reason)
                self._failures.append(
                    LaunchFailure(request.request_id, request.run_name, reason, capacity=True)
                )
                return ""
            url = self._metadata.url_for(request.request_id)
            return self._inner.launch(replace(request, env={**request.env, METADATA_URL_ENV: url}))

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

    def _holding(self, instances: list[Instance]) -> list[Instance]:
        """Live workers that hold a slot: every one the market has not reclaimed."""
        return [i for i in instances if i.alive and i.request_id not in self._reclaimed]

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
            runs = {i.request_id: i.run_name for i in holding}
            for request_id in self.market.draw(list(runs), excess):
                self._reclaim(request_id, runs[request_id], now)
        return instances

    def _reclaim(self, request_id: str, run_name: str, now: float) -> None:
        self._reclaimed.add(request_id)
        trace_s, capacity = self.market.trace_s(), self.market.capacity()
        if self.market.kill_without_notice():
            logger.warning(
                "run %s worker %s: spot market reclaims it without notice (kill -9; trace %.0f s, %d slots)",
                run_name, request_id, trace_s, capacity,
            )  # fmt: skip
            self._inner.kill(request_id)
            return
        notice_s = self.market.notice_wall_s()
        logger.warning(
            "run %s worker %s: spot market reclaims it: notice, ends in %.1f s (trace %.0f s, %d slots)",
            run_name, request_id, notice_s, trace_s, capacity,
        )  # fmt: skip
        self._metadata.interrupt(request_id, notice_s)
        self._terminate_at[request_id] = now + notice_s

    def _marked(self, instance: Instance) -> Instance:
        details = {
            **instance.details,
            "market": MARKET,
            "interrupted": instance.request_id in self._reclaimed,
        }
        return replace(instance, details=details)
