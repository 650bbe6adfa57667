"""State shared by the agent's threads: the training thread, the heartbeat thread and signal handlers.

The training thread writes progress snapshots and reads the stop request; the heartbeat thread reads
the snapshot and writes what the orchestrator said (stop, checkpointer role). Every access holds one lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from worker import context
from worker.protocol.workers import (
    LEAVING_PHASE,
    AveragingCounts,
    DeregisterReason,
    Heartbeat,
    HeartbeatReply,
    WorkerAction,
)

logger = logging.getLogger(__name__)

#: logged when the orchestrator's reply gives this worker the checkpointer role, and when it takes it away
CHECKPOINTER_TAKEN = "this worker is the run's checkpointer now: it saves the run's checkpoints"
CHECKPOINTER_GIVEN_UP = "this worker is no longer the run's checkpointer"


def _call_in_own_thread(listener: Callable[[], None]) -> None:
    threading.Thread(target=listener, name="stop-listener", daemon=True).start()


class EarlyLeave(NamedTuple):
    """A noticed worker's scheduled leave: ``at`` (wall clock), and ``now``, which requests it at once."""

    at: float
    now: Callable[[], None]


@dataclass(frozen=True)
class Progress:
    """What the next heartbeat reports; replaced as a whole by the training thread."""

    local_step: int = 0
    swarm_epoch: int = 0
    local_epoch: int = 0
    samples: int = 0
    loss: float | None = None
    samples_per_s: float = 0.0
    num_peers: int = 0
    visible_maddrs: tuple[str, ...] = field(default_factory=tuple)
    phase: str = "starting"
    metrics: dict[str, float] = field(default_factory=dict)  # the run's report_metrics (bounded)
    averaging: AveragingCounts | None = None  # outcomes of the swarm epochs so far


@dataclass(frozen=True)
class StopRequest:
    """Why the agent leaves, and by when (monotonic clock) it must be gone."""

    reason: DeregisterReason
    message: str | None
    deadline: float


class AgentState:
    """Thread-safe shared state; see the module docstring for who writes what."""

    def __init__(self, checkpoint_every_epochs: int, latest_checkpoint_epoch: int | None = None) -> None:
        self._lock = threading.Lock()
        self._progress = Progress()
        self._stop: StopRequest | None = None
        self.stop_requested = threading.Event()
        self._stop_listeners: list[Callable[[], None]] = []
        self._checkpointer = False
        self._checkpoint_every_epochs = checkpoint_every_epochs
        self._latest_checkpoint_epoch = latest_checkpoint_epoch
        self._stop_requested_at = float("inf")
        self._leaving = False
        self._early_leave: EarlyLeave | None = None

    def configure(self, checkpoint_every_epochs: int, latest_checkpoint_epoch: int | None) -> None:
        """Take the run's checkpoint cadence and latest stored checkpoint (from the registration)."""
        with self._lock:
            self._checkpoint_every_epochs = max(1, checkpoint_every_epochs)
            self._latest_checkpoint_epoch = latest_checkpoint_epoch

    # -- progress (training thread writes, heartbeat thread reads) -------------------------------

    def update_progress(self, **changes: object) -> None:
        with self._lock:
            self._progress = replace(self._progress, **changes)  # type: ignore[arg-type]

    @property
    def progress(self) -> Progress:
        with self._lock:
            return self._progress

    def mark_leaving(self, early_leave: EarlyLeave | None = None) -> None:
        """A spot notice came: heartbeats say ``leaving`` (until ``stopping``), so that the orchestrator
        launches the replacement while this worker still trains. ``early_leave``: when it is to leave at
        the latest, and how to leave sooner (the training callback does when no averaging round of its
        remains before then)."""
        with self._lock:
            self._leaving = True
            self._early_leave = early_leave

    @property
    def early_leave(self) -> EarlyLeave | None:
        """The leave a spot notice scheduled, while no stop was requested yet."""
        with self._lock:
            return self._early_leave if self._stop is None else None

    def heartbeat(self) -> Heartbeat:
        """The heartbeat body for the current progress."""
        with self._lock:
            progress, leaving = self._progress, self._leaving
        phase = LEAVING_PHASE if leaving and progress.phase != "stopping" else progress.phase
        return Heartbeat(
            local_step=progress.local_step,
            swarm_epoch=progress.swarm_epoch,
            samples=progress.samples,
            loss=progress.loss,
            samples_per_s=progress.samples_per_s,
            num_peers=progress.num_peers,
            visible_maddrs=list(progress.visible_maddrs[:16]),
            phase=phase,
            metrics=dict(progress.metrics),
            averaging=progress.averaging,
        )

    # -- orchestrator's answers (heartbeat thread writes, training thread reads) -----------------

    def apply_reply(self, reply: HeartbeatReply) -> None:
        """Take the checkpointer role and cadence from a reply; a ``stop`` action requests a stop."""
        with self._lock:
            role_changed = self._checkpointer != reply.checkpointer
            self._checkpointer = reply.checkpointer
            self._checkpoint_every_epochs = max(1, reply.checkpoint_every_epochs)
            if reply.latest_checkpoint_epoch is not None:
                self._latest_checkpoint_epoch = max(
                    reply.latest_checkpoint_epoch, self._latest_checkpoint_epoch or 0
                )
        if role_changed:  # the role decides whether a stop saves a final checkpoint: worth a line
            logger.info(CHECKPOINTER_TAKEN if reply.checkpointer else CHECKPOINTER_GIVEN_UP)
        context.set_live_count(reply.num_workers)
        if reply.action == WorkerAction.stop:
            self.request_stop(DeregisterReason.stopped, "the orchestrator asked this worker to stop")

    @property
    def checkpointer(self) -> bool:
        with self._lock:
            return self._checkpointer

    @property
    def checkpoint_every_epochs(self) -> int:
        with self._lock:
            return self._checkpoint_every_epochs

    @property
    def latest_checkpoint_epoch(self) -> int | None:
        with self._lock:
            return self._latest_checkpoint_epoch

    def checkpoint_uploaded(self, epoch: int) -> None:
        with self._lock:
            self._latest_checkpoint_epoch = max(epoch, self._latest_checkpoint_epoch or 0)

    # -- stopping (any thread) ---------------------------------------------------------------------

    def request_stop(
        self, reason: DeregisterReason, message: str | None = None, within_s: float | None = None
    ) -> bool:
        """Ask the agent to leave for ``reason``. The first reason wins; a later, earlier deadline applies.

        An ``interrupted`` request (spot notice) overrides an earlier ``stopped``: the machine goes away
        either way, and the orchestrator should know why. Returns True for the first request.
        """
        now = time.monotonic()
        deadline = now + (within_s if within_s is not None else float("inf"))
        with self._lock:
            first = self._stop is None
            if first:
                self._stop_requested_at = now
            if first or (reason == DeregisterReason.interrupted and self._stop is not None):
                current = self._stop
                keep_deadline = current.deadline if current else float("inf")
                self._stop = StopRequest(reason, message, min(deadline, keep_deadline))
            elif self._stop is not None and deadline < self._stop.deadline:
                self._stop = replace(self._stop, deadline=deadline)
            listeners = list(self._stop_listeners) if first else []
        self.stop_requested.set()
        for listener in listeners:
            _call_in_own_thread(listener)
        return first

    def on_stop(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` at the first stop request (at once if one came), in a thread of its own: a
        stop is often requested from a signal handler, which must not wait on locks the interrupted
        code may hold."""
        with self._lock:
            if self._stop is None:
                self._stop_listeners.append(listener)
                return
        _call_in_own_thread(listener)

    @property
    def stop(self) -> StopRequest | None:
        with self._lock:
            return self._stop

    @property
    def stop_requested_at(self) -> float:
        """Monotonic time of the first stop request (infinity while none)."""
        with self._lock:
            return self._stop_requested_at
