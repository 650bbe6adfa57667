"""Leaving a swarm cleanly: goodbye to peers, averagers stopped, DHT stopped, no tracebacks.

hivemind's processes talk to the DHT process through one pipe, and every request carries a pipe end
that the DHT fetches from the sender's ``multiprocessing`` resource sharer. A request the DHT reads
after its sender exited is lost with a logged ``FileNotFoundError`` (or an ``EOFError`` that kills
the DHT process), and the DHT then pauses for 3 s. Averagers send requests right up to their exit
(cancelling a pre-scheduled round makes them leave its group) and a busy DHT reads its pipe seconds
late, so plain ``hivemind.Optimizer.shutdown`` followed by ``DHT.shutdown`` shows tracebacks and
often ends by terminating the DHT. ``shutdown_optimizer`` instead lets pending rounds finish (with
zero weight), says goodbye, waits until the DHT has read everything queued, and only then stops
the averagers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging

import hivemind
from hivemind.averaging.control import StepControl
from hivemind.averaging.matchmaking import MatchmakingException
from hivemind.averaging.partition import AllreduceException

log = logging.getLogger(__name__)

_ROUND_TIMEOUT_S = 30.0
_DRAIN_KEY = "_spotswarm_drain"
_TRACKER_JOIN_TIMEOUT_S = 10.0
_ROUND_FAILURES = (
    AllreduceException,
    MatchmakingException,
    concurrent.futures.TimeoutError,
    concurrent.futures.CancelledError,
    asyncio.CancelledError,
)


def shutdown_optimizer(optimizer: hivemind.Optimizer) -> None:
    """Finish pending averaging rounds, shut hivemind's optimizer down, and collect what it left."""
    for control in (optimizer.scheduled_grads, optimizer.scheduled_state):
        if control is not None and not control.done():
            _finish_with_zero_weight(control, optimizer.averaging_timeout or _ROUND_TIMEOUT_S)
    optimizer.tracker.shutdown(optimizer.shutdown_timeout)  # goodbye to peers; no more progress reports
    _drain_dht_requests(optimizer.dht)
    optimizer.shutdown()
    optimizer.tracker.join(_TRACKER_JOIN_TIMEOUT_S)  # its thread must let go of its event loop
    _collect_finished_event_loops()


def _finish_with_zero_weight(control: StepControl, timeout_s: float) -> None:
    """Let a pre-scheduled round run to its end, contributing nothing.

    Cancelling it instead (what ``hivemind.Optimizer.shutdown`` does with rounds still looking for a
    group) makes the averager leave its group with a last DHT request just before it exits.
    Peers in the round lose nothing: a weight of zero changes no average.
    """
    if not control.triggered:
        control.weight = 0.0
        control.allow_allreduce()
    try:
        control.result(timeout_s)
    except _ROUND_FAILURES as exc:  # alone, or peers left: nothing was averaged, and nothing needed to be
        log.debug("last averaging round ended without peers: %r", exc)


def _drain_dht_requests(dht: hivemind.DHT) -> None:
    """Return once the DHT process has read every request queued so far (from any process).

    All processes write requests into one pipe, read in order, so one round trip from here is enough.
    A busy DHT (every local step stores progress) can lag seconds behind its pipe; requests it reads
    after their sender (an averager) exited are lost with an error, so averagers must outlive them.
    """
    if dht.is_alive():
        dht.get(_DRAIN_KEY, latest=False)


class _PendingTaskFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Task was destroyed but it is pending")


def _collect_finished_event_loops() -> None:
    """Collect what the progress tracker's finished event loop left behind, without its noise.

    The tracker's thread stops its loop right after cancelling its last tasks, so they stay pending
    forever and asyncio logs "Task was destroyed but it is pending!" when they are collected
    (often at interpreter exit). Collect them now, while that one message is filtered.
    """
    asyncio_logger = logging.getLogger("asyncio")
    quiet = _PendingTaskFilter()
    asyncio_logger.addFilter(quiet)
    try:
        gc.collect()
    finally:
        asyncio_logger.removeFilter(quiet)
