"""Leaving a swarm cleanly: goodbye to peers, averagers stopped, DHT stopped, no tracebacks.

hivemind's processes talk to the DHT process through one pipe, and every request carries a pipe end
that the DHT fetches from the sender's ``multiprocessing`` resource sharer. A request the DHT reads
after its sender exited is lost with a logged ``FileNotFoundError`` (or an ``EOFError`` that kills
the DHT process), and the DHT then pauses for 3 s. Averagers send requests right up to their exit
(cancelling a pre-scheduled round makes them leave its group) and a busy DHT reads its pipe seconds
late, so plain ``hivemind.Optimizer.shutdown`` followed by ``DHT.shutdown`` often shows tracebacks
and ends by terminating the DHT. ``shutdown_optimizer`` cancels pending matchmaking first, says
goodbye, waits until the DHT has read everything queued so far, and only then stops the averagers.
This narrows hivemind's race a lot; it cannot close it (an averager may still send a request in its
last milliseconds), so ``worker.swarm_dht`` also turns the resulting error into a debug line.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import hivemind
from hivemind.averaging.control import AveragingStage

log = logging.getLogger(__name__)

_DRAIN_KEY = "_spotswarm_drain"
_TRACKER_JOIN_TIMEOUT_S = 10.0


def shutdown_optimizer(optimizer: hivemind.Optimizer) -> None:
    """Say goodbye to peers and stop hivemind's optimizer, leaving the DHT nothing to trip on.

    Rounds still looking for a group are cancelled first (as ``hivemind.Optimizer.shutdown`` would,
    but earlier), so the averagers' last matchmaking requests reach the DHT while they still run.
    """
    for control in (optimizer.scheduled_grads, optimizer.scheduled_state):
        if control is not None and not control.done() and control.stage == AveragingStage.LOOKING_FOR_GROUP:
            control.cancel()
    optimizer.tracker.shutdown(optimizer.shutdown_timeout)  # goodbye to peers; no more progress reports
    _drain_dht_requests(optimizer.dht)
    optimizer.shutdown()  # tags along rounds already running, then stops the averagers
    optimizer.tracker.join(_TRACKER_JOIN_TIMEOUT_S)
    _quiet_abandoned_event_loops()


def _drain_dht_requests(dht: hivemind.DHT) -> None:
    """Return once the DHT process has read every request queued so far (from any process).

    All processes write requests into one pipe, read in order, so one round trip from here is enough.
    A busy DHT (every local step stores progress) can lag seconds behind its pipe; requests it reads
    after their sender (an averager) exited are lost with an error, so averagers must outlive them.
    """
    if dht.is_alive():
        dht.get(_DRAIN_KEY, latest=False)


def _quiet_abandoned_event_loops() -> None:
    """Keep hivemind's abandoned event loops from logging errors when the process exits.

    The progress tracker's thread stops its event loop right after cancelling its last tasks, so
    they stay pending, and asyncio logs "Task was destroyed but it is pending!" when they are
    finally collected (at interpreter exit). Loops that are neither running nor closed but still
    have pending tasks are abandoned; they get a handler that drops just that message.
    """
    pending = [obj for obj in gc.get_objects() if type(obj) is asyncio.Task and not obj.done()]
    for loop in {task.get_loop() for task in pending}:
        if not loop.is_running() and not loop.is_closed():
            loop.set_exception_handler(_drop_destroyed_pending_task)


def _drop_destroyed_pending_task(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    if str(context.get("message", "")).startswith("Task was destroyed but it is pending"):
        return
    loop.default_exception_handler(context)
