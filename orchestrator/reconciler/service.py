"""The reconcile loop as a background service of the app: ticks in a thread, only while leading.

``create_app`` makes one when the ``reconcile`` setting is on (``settings.reconciler.enabled``), over the
app's database and launchers.
"""

from __future__ import annotations

import logging

from orchestrator.background import PeriodicService
from orchestrator.reconciler.leader import AlwaysLeader, LeaderElection
from orchestrator.reconciler.loop import Reconciler

logger = logging.getLogger(__name__)


class ReconcilerService:
    """The reconciler as a background service of the app: ticks in a thread, closes launchers at stop.

    With several orchestrators on one database only the leader ticks (``leader.py``); the others check
    every interval and take over when the leader's lock is released.
    """

    name = "reconciler"

    def __init__(
        self, reconciler: Reconciler, tick_interval_s: float, leader: LeaderElection | None = None
    ) -> None:
        self.reconciler = reconciler
        self.leader = leader or AlwaysLeader()
        self._leading = False
        self._periodic = PeriodicService(self.name, tick_interval_s, self._tick_if_leader)

    def _tick_if_leader(self) -> None:
        leading = self.leader.check()
        if leading and not self._leading:
            self.reconciler.started_at = self.reconciler.clock()  # grace periods count from the takeover
        self._leading = leading
        if leading:
            self.reconciler.tick()

    async def start(self) -> None:
        logger.info("reconcile loop started with launchers: %s", ", ".join(self.reconciler.launchers))
        await self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()
        self.leader.release()
        for launcher in self.reconciler.launchers.values():
            launcher.close()  # workers keep running: they outlive an orchestrator restart
