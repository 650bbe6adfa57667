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
last milliseconds), so :func:`worker._hivemind_compat.quiet_dead_sender_errors` also turns the
resulting error into a debug line. A round cancelled just as it found its group races the same way
inside the averager's process (:func:`worker._hivemind_compat.quiet_cancelled_rounds`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import hivemind
from hivemind.averaging import DecentralizedAverager
from hivemind.averaging.control import AveragingStage, StepControl
from hivemind.utils import get_dht_time

from worker._hivemind_compat import quiet_abandoned_event_loops

log = logging.getLogger(__name__)

_DRAIN_KEY = "_spotswarm_drain"
_LEAVE_GRACE_S = 2.0
_POLL_S = 0.05
_TRACKER_JOIN_TIMEOUT_S = 10.0


def shutdown_optimizer(optimizer: hivemind.Optimizer, keep_progress: bool = False) -> None:
    """Say goodbye to peers and stop hivemind's optimizer, leaving the DHT nothing to trip on.

    Rounds still looking for a group are cancelled first (as ``hivemind.Optimizer.shutdown`` would,
    but earlier), and their averagers are given until ``matchmaking_time`` + 2 s to leave the group,
    so that their last matchmaking requests reach the DHT while they still run.

    hivemind's goodbye withdraws the peer's progress record. With ``keep_progress`` the record stays
    until it expires instead: a peer that leaves because the run reached its target leaves the final
    epoch readable, or every peer of the run would withdraw it at once and nobody could see it reached.
    """
    started_at = time.monotonic()
    leaving = []
    if cancel_if_looking(optimizer.scheduled_grads):
        optimizer.scheduled_grads = None  # handled: hivemind's shutdown must not cancel it a second time
        leaving.append(optimizer.grad_averager)
    if cancel_if_looking(optimizer.scheduled_state):
        optimizer.scheduled_state = None
        leaving.append(optimizer.state_averager)
    if keep_progress:
        stop_tracker_keeping_record(optimizer.tracker, optimizer.shutdown_timeout)
    else:
        optimizer.tracker.shutdown(optimizer.shutdown_timeout)  # goodbye to peers; no more progress reports
    deadline = time.monotonic() + (optimizer.matchmaking_time or 0.0) + _LEAVE_GRACE_S
    for averager in leaving:
        _wait_until_left_group(optimizer.dht, averager, deadline)
    _drain_dht_requests(optimizer.dht)
    left_at = time.monotonic()
    optimizer.shutdown()  # tags along rounds already running, then stops the averagers
    optimizer.tracker.join(_TRACKER_JOIN_TIMEOUT_S)
    quiet_abandoned_event_loops()
    log.debug(
        "optimizer shut down: %.2f s to leave groups and drain the DHT, %.2f s to stop the averagers",
        left_at - started_at,
        time.monotonic() - left_at,
    )


def stop_tracker_keeping_record(tracker: Any, timeout: float | None) -> None:
    """``ProgressTracker.shutdown`` storing the peer's last progress where it stores the withdrawing ``None``.

    hivemind 1.1.12's reporter cancels a store still in flight when it stops, and may stop before it took
    the last report at all (a run's last step ends an epoch, and the peer leaves at once): the record
    would show the epoch before. So the last progress is stored here, after the reporter stopped, and
    waited for. ``hivemind.Optimizer.shutdown`` calls the tracker's ``shutdown`` again, which would
    store that ``None`` after all: this tracker's ``shutdown`` becomes a no-op.
    """
    _stop_tracker_thread(tracker, timeout)
    stored = tracker.dht.store(
        tracker.training_progress_key,
        subkey=tracker._local_public_key,
        value=tracker.local_progress.dict(),
        expiration_time=get_dht_time() + tracker.metadata_expiration,
        return_future=True,
    )
    try:
        stored.result(timeout)
    except TimeoutError:
        log.warning("the last progress record was not stored within %s s", timeout)


def stop_orphaned_optimizer(optimizer: hivemind.Optimizer) -> None:
    """Stop the progress tracker of an optimizer whose averagers are gone, with nothing sent to the DHT.

    A signal that ends hivemind's forked processes (DHT, averagers) at once leaves nobody to say
    goodbye through (the worker agent has them let SIGTERM and SIGINT pass; a process that runs the
    strategy on its own may not). The tracker is a thread of this process and would run on: interpreter
    shutdown then waits forever for the executor thread it left waiting on its shutdown event (and logs
    "cannot schedule new futures after shutdown" from the thread itself). A process that died holding
    one of hivemind's inter-process locks can still block the tracker (``_hivemind_compat.own_mpfuture_locks``
    says which), which is why a test cannot show this on demand; reproduced by hand: a lone peer whose
    forked processes all got SIGTERM mid-fit then waited forever at exit.
    """
    log.warning("hivemind's processes were ended by a signal: leaving the swarm without a goodbye")
    _stop_tracker_thread(optimizer.tracker, optimizer.shutdown_timeout)
    optimizer.tracker.join(_TRACKER_JOIN_TIMEOUT_S)
    quiet_abandoned_event_loops()


def _stop_tracker_thread(tracker: Any, timeout: float | None) -> None:
    """End the tracker's reporting and fetching (and the executor waits they leave), then make its own
    ``shutdown``, which hivemind calls again and which would store a goodbye, a no-op."""
    tracker.shutdown_triggered.set()
    tracker.should_report_progress.set()
    tracker.global_state_updated.set()
    tracker.shutdown_complete.wait(timeout)
    tracker.shutdown = _tracker_already_stopped


def _tracker_already_stopped(timeout: float | None = None) -> None:
    """Stands in for the ``shutdown`` of a tracker stopped here (:func:`_stop_tracker_thread`)."""


def cancel_if_looking(control: StepControl | None) -> bool:
    """Cancel a pre-scheduled round still looking for its group; True if it was cancelled."""
    if control is None or control.done() or control.stage != AveragingStage.LOOKING_FOR_GROUP:
        return False
    control.cancel()
    return True


def _wait_until_left_group(dht: hivemind.DHT, averager: DecentralizedAverager, deadline: float) -> None:
    """Wait until the DHT shows that ``averager`` left its matchmaking group (or ``deadline`` passes).

    A cancelled round does not end at once: the averager's matchmaking then marks itself as no longer
    looking for a group, under ``<prefix>.0b<group bits>`` (hivemind's group key), and only after
    that write is it quiet. Until then it must not be stopped.
    """
    key = f"{averager.prefix}.0b{averager.get_group_bits()}"
    subkey = averager.peer_id.to_bytes()
    while time.monotonic() < deadline:
        record = dht.get(key, latest=True)
        entries = record.value if record is not None and isinstance(record.value, dict) else {}
        entry = entries.get(subkey)
        if entry is None or entry.value is False:
            return
        time.sleep(_POLL_S)
    log.debug("averager %s still looked for a group at shutdown", averager.prefix)


def _drain_dht_requests(dht: hivemind.DHT) -> None:
    """Return once the DHT process has read every request queued so far (from any process).

    All processes write requests into one pipe, read in order, so one round trip from here is enough.
    A busy DHT (every local step stores progress) can lag seconds behind its pipe; requests it reads
    after their sender (an averager) exited are lost with an error, so averagers must outlive them.
    """
    if dht.is_alive():
        dht.get(_DRAIN_KEY, latest=False)
