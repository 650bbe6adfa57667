"""Work that runs beside the API for the server's lifetime: the protocol, and a periodic service.

A leaf module (it imports nothing of the orchestrator), so that anything may run a tick every few
seconds without importing the app's container.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

logger = logging.getLogger(__name__)


class BackgroundService(Protocol):
    """Something that runs beside the API for the server's lifetime."""

    name: str

    async def start(self) -> None:
        """Begin work (return quickly: spawn a task)."""
        ...

    async def stop(self) -> None:
        """Finish work and release resources; must not raise for an already stopped service."""
        ...


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
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await self._stopping.wait()

    async def _run_once(self) -> None:
        try:
            await asyncio.to_thread(self._tick)
        except Exception:  # logged with traceback; the loop must survive one bad tick
            logger.exception("%s: tick failed", self.name)

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            await self._task
            self._task = None
            if self._final_tick:
                await self._run_once()
