"""The heartbeat thread: reports progress every ``interval_s``, applies the replies, refreshes peers.

An unreachable orchestrator (no answer, a time-out or a 5xx) does not stop training at once: the beat is
logged and tried again next interval, so workers ride out an orchestrator restart. Only when no beat
got an answer for ``lost_timeout_s`` is the orchestrator taken for gone and ``on_lost`` called (the
agent then leaves). If the orchestrator answers that it no longer knows this worker (401/403/404) or
refuses its heartbeats (409), it is there, and the agent is asked to stop at once, since nobody would
count or coordinate it any more.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from worker.agent.boot import save_peers
from worker.agent.client import (
    ApiError,
    Conflict,
    NotFound,
    OrchestratorClient,
    Unauthorized,
    Unreachable,
)
from worker.agent.state import AgentState
from worker.protocol.workers import DeregisterReason

logger = logging.getLogger(__name__)


class Heartbeater(threading.Thread):
    """Sends :class:`worker.protocol.workers.Heartbeat` for ``worker_id`` until :meth:`halt` is called.

    ``peers_refresh_s`` is how often the run's peer list is fetched and cached in ``worker_dir`` so a
    restarted worker can rejoin the swarm while the orchestrator is down. ``on_lost(silent_s)`` is
    called once when no beat was answered for ``lost_timeout_s`` (0: never), counted from the start.
    """

    def __init__(
        self,
        client: OrchestratorClient,
        state: AgentState,
        worker_id: str,
        run_name: str,
        interval_s: float,
        worker_dir: Path,
        peers_refresh_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        lost_timeout_s: float = 0.0,
        on_lost: Callable[[float], None] | None = None,
    ) -> None:
        super().__init__(name="spotswarm-heartbeat", daemon=True)
        self._client = client
        self._state = state
        self._worker_id = worker_id
        self._run_name = run_name
        self._interval_s = interval_s
        self._worker_dir = worker_dir
        self._peers_refresh_s = peers_refresh_s
        self._clock = clock
        self._halt = threading.Event()
        self._send_lock = threading.Lock()
        self._next_peers_refresh = clock() + peers_refresh_s
        self._lost_timeout_s = lost_timeout_s
        self._on_lost = on_lost
        self._last_answer = clock()
        self._lost_reported = False
        self.beats_sent = 0

    def run(self) -> None:
        while True:
            self.beat()
            if self._halt.wait(self._interval_s):
                return
            if self._clock() >= self._next_peers_refresh:
                self._refresh_peers()

    def halt(self, final_phase: str | None = "stopping", timeout_s: float = 10.0) -> None:
        """Stop the thread; send one last heartbeat (in ``final_phase``) unless that is None."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout=timeout_s)
        if final_phase is not None:
            self._state.update_progress(phase=final_phase)
            self.beat()

    def beat(self) -> bool:
        """Send one heartbeat now and apply the reply; True if the orchestrator answered."""
        with self._send_lock:
            try:
                reply = self._client.heartbeat(self._worker_id, self._state.heartbeat())
            except Unreachable as exc:
                logger.warning("worker %s: heartbeat not delivered: %s", self._worker_id, exc)
                self._check_lost()
                return False
            except ApiError as exc:  # an answer, so the orchestrator is there: it refused this beat
                self._last_answer = self._clock()
                self._refused(exc)
                return False
            self._last_answer = self._clock()
            self.beats_sent += 1
        self._state.apply_reply(reply)
        return True

    def _refused(self, exc: ApiError) -> None:
        if isinstance(exc, (Unauthorized, NotFound, Conflict)):
            logger.error(
                "worker %s: the orchestrator refuses this worker's heartbeats: %s", self._worker_id, exc
            )
            self._state.request_stop(DeregisterReason.stopped, f"heartbeat refused: {exc}")
        else:
            logger.error("worker %s: heartbeat rejected: %s", self._worker_id, exc)

    def _check_lost(self) -> None:
        """Call ``on_lost`` once when nothing answered for ``lost_timeout_s``."""
        silent_s = self._clock() - self._last_answer
        if self._lost_reported or not self._lost_timeout_s or silent_s < self._lost_timeout_s:
            return
        self._lost_reported = True
        if self._on_lost is not None:
            self._on_lost(silent_s)

    def _refresh_peers(self) -> None:
        self._next_peers_refresh = self._clock() + self._peers_refresh_s
        try:
            peers = self._client.run_peers(self._run_name)
        except ApiError as exc:
            logger.info("worker %s: could not refresh peers: %s", self._worker_id, exc)
            return
        save_peers(self._worker_dir, self._run_name, peers.initial_peers)
