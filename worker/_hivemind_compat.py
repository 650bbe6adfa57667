"""Workarounds of hivemind 1.1.12's behaviour, in one private module: the only place spotswarm changes
hivemind (process-wide, in the process that calls them).

:func:`install` is the entry point: ``HivemindStrategy`` calls it when it builds its optimizer (both sync
modes), before hivemind forks its averagers, and it applies every process-wide fix of averaging and the
DHT's log filter below (idempotent: a second call changes nothing). A program that drives hivemind itself
in the same process gets the patched hivemind; nothing is changed before the first call. The other fixes
belong to one object or one process, and their owner applies them: :func:`own_mpfuture_locks` in a peer
forked from a process that imported hivemind, :func:`survive_unreadable_requests` and
:func:`p2pd_in_own_session` in a DHT's own process (``worker/strategy/dht.py``, the orchestrator's DHT
process), :func:`expose_defaults` on an optimizer, :func:`quiet_refusal_tracebacks` by the admission guard,
:func:`quiet_abandoned_event_loops` when an optimizer shuts down.

hivemind is pinned (``hivemind==1.1.12``). Each fix below says what hivemind does, why that hurts here,
the version it was written against, and the upstream issue where one was found; when the pin moves,
re-check each against its test (named in its docstring) and delete what upstream has fixed.

- :func:`keep_averager_tasks_alive`: averagers' matchmaking tasks destroyed half-way by the garbage
  collector, leaving a peer that never finds a group again.
- :func:`cancel_rounds_before_signalling`: a cancelled averaging round that goes on, joins a groupmate's
  round with stale tensors, and holds the averager until the next round times out.
- :func:`own_mpfuture_locks`: peers forked from one process sharing hivemind's inter-process locks, so one
  killed while holding a lock blocks all the others.
- :func:`bound_matchmaking_dht_calls`: an averager's matchmaking waiting forever for a DHT request that
  is never answered, with the same outcome.
- :func:`pace_group_lookups`: an averager looking for a group reading the DHT in a loop, hundreds of
  times a second, for as long as it looks.
- :func:`finalize_running_groups_on_shutdown`: an averager shut down in the middle of a round dying with a
  traceback, its round left running.
- :func:`expose_defaults`: ``hivemind.Optimizer`` without the ``defaults`` every torch optimizer has.
- :func:`quiet_dead_sender_errors`: the DHT's traceback for a request whose sender already exited.
- :func:`survive_unreadable_requests`: the DHT process dying when a request's reply pipe cannot be
  fetched from its sender.
- :func:`quiet_cancelled_rounds`: asyncio's "never retrieved" record of a round cancelled as it found
  its group.
- :func:`quiet_abandoned_event_loops`: "Task was destroyed but it is pending!" at exit, from the progress
  tracker's stopped event loop.
- :func:`quiet_refusal_tracebacks`: a traceback per call refused by the averaging guard.
- :func:`p2pd_in_own_session`: ``p2pd`` ended by a SIGTERM meant for the worker (sent to its whole
  process group), under the peer's orderly leave.

Not here, because they override hivemind's own classes: ``Optimizer._make_gradient_averager``
(``optimizer.py``: hivemind gives ``averager_opts`` to the state averager only), ``StateAverager``
(``optimizer.py``: a state round hivemind starts itself is held nowhere a leaving peer could cancel it),
and ``SwarmLightningOptimizer`` (``optimizer.py``), Lightning's optimizer wrapper without the
``hivemind.Optimizer.__del__`` it would inherit (collecting a discarded wrapper shut down the shared
averagers; hivemind 1.1.12, no upstream issue found). It subclasses Lightning's wrapper, and this module
must load without Lightning: plain DHT peers (``dht.py``) and the admission guard import it. The orderly
leave that narrows the DHT's pipe race lives in ``shutdown.py``; the log filter for what it cannot rule
out is here.

Log records are filtered by exception type and, where hivemind raises no type of its own, by message
text: a reworded upstream message makes the record visible again (the safe direction), never hides
another one.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import gc
import logging
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import InvalidStateError
from typing import Any, TypeVar

import hivemind
from hivemind.averaging import averager as averager_module
from hivemind.averaging.control import StepControl
from hivemind.averaging.key_manager import GroupKeyManager
from hivemind.utils import asyncio as hivemind_asyncio
from hivemind.utils.mpfuture import MPFuture

from worker.runtime.logsetup import install_filter

log = logging.getLogger(__name__)
OptimizerT = TypeVar("OptimizerT", bound=hivemind.Optimizer)


def install() -> None:
    """Apply the process-wide fixes of hivemind's averaging and the DHT's log filter (idempotent).

    In order: :func:`quiet_cancelled_rounds`, :func:`keep_averager_tasks_alive`,
    :func:`cancel_rounds_before_signalling`, :func:`bound_matchmaking_dht_calls`,
    :func:`pace_group_lookups`, :func:`finalize_running_groups_on_shutdown` and
    :func:`quiet_dead_sender_errors`. Call it before hivemind forks an averager (its processes inherit
    the patches). Raises nothing of its own; each fix finds hivemind's attributes at import time.
    """
    quiet_cancelled_rounds()
    keep_averager_tasks_alive()
    cancel_rounds_before_signalling()
    bound_matchmaking_dht_calls()
    pace_group_lookups()
    finalize_running_groups_on_shutdown()
    quiet_dead_sender_errors()


# -- averagers' tasks kept referenced until done ------------------------------------------------------

#: set on our wrappers of hivemind functions, so that installing one twice is a no-op
_MARK = "_spotswarm_patched"
_live_tasks: set[asyncio.Future[Any]] = set()


def keep_alive_task_factory(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any
) -> asyncio.Future[Any]:
    """An asyncio task factory that holds each task until it is done."""
    task = asyncio.Task(coro, loop=loop, **kwargs)
    _live_tasks.add(task)
    task.add_done_callback(_live_tasks.discard)
    return task


def keep_averager_tasks_alive() -> None:
    """Make every averager started from now on keep its tasks referenced until done (idempotent).

    Upstream behaviour (hivemind 1.1.12): when a pre-scheduled averaging round is called off (a peer
    that thinks it is alone, e.g. while the swarm forms, or a state round that is not due),
    ``DecentralizedAverager`` cancels its matchmaking without awaiting it. asyncio holds tasks by weak
    reference only (the averager's request loop drops each ``_step`` task it creates), so the garbage
    collector can destroy that task before its clean-up ran ("Task was destroyed but it is pending!").
    The clean-up releases the averager's matchmaking lock; without it every later round of that
    averager waits on the lock until its timeout ("Another look_for_group is already in progress"),
    and the peer trains on local gradients alone for the rest of the run ("Averaging step failed:
    could not find a group", round after round). ``bench/matchmaking.py`` measures the difference.

    The remedy is the asyncio documentation's: keep a strong reference to every task until it is done.
    The averager runs its own event loop in a forked process, made by ``switch_to_uvloop``; this wraps
    that function, as the averager module sees it, so that :func:`keep_alive_task_factory` is the
    loop's task factory from its first task on. (It was first installed by the averager's first
    ``_step``, which left that step's own task unprotected: the first peer of a swarm calls off exactly
    those first rounds, and the swarm tests caught a peer whose averagers never formed a group again.)
    Call this before hivemind starts (forks) its averagers: the averager processes inherit the change.

    Upstream issue: none found for this cause (learning-at-home/hivemind#519 reports the same "could
    not find a group" message, undiagnosed). Test: ``tests/integration/test_swarm_keepalive.py``.
    """
    original: Callable[..., asyncio.AbstractEventLoop] = averager_module.switch_to_uvloop
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def loop_keeping_tasks(*args: Any, **kwargs: Any) -> asyncio.AbstractEventLoop:
        loop = original(*args, **kwargs)
        loop.set_task_factory(keep_alive_task_factory)  # type: ignore[arg-type]
        return loop

    setattr(loop_keeping_tasks, _MARK, True)
    averager_module.switch_to_uvloop = loop_keeping_tasks


# -- cancelled rounds that go on -----------------------------------------------------------------------


def cancel_rounds_before_signalling() -> None:
    """Make ``StepControl.cancel`` write the cancelled state before it tells the averager (idempotent).

    Upstream behaviour (hivemind 1.1.12): ``StepControl.cancel`` first cancels the round's trigger and
    sets its cancel future, both of which wake the averager's process, and only then marks the control
    itself cancelled. The averager, woken, asks ``step.cancelled()``; if the trainer's process has not
    yet run that last line (a loaded machine deschedules it for a moment), the answer is no, and the
    averager goes on with the round. Its trigger being cancelled counts as "triggered", so the round
    joins the first group it finds and averages whatever the averager's buffers hold; the partner
    averages its gradients with those stale tensors, and this averager's next round waits on the
    matchmaking lock behind it ("Another look_for_group is already in progress"), then finds no group
    (the partner moved on) and the trainer waits out ``averaging_timeout`` on it. ``hivemind.Optimizer``
    cancels a pre-scheduled round each epoch that its tracker counts no other peer, so a swarm's first
    epochs, where peers see each other a moment apart, hit it: in ``bench/time_to_accuracy.py`` two peers
    stalled for the 10 s averaging timeout in 2 of 6 trials on a loaded 2-core machine.

    The fix writes the state first: by the time the averager is woken, ``cancelled()`` is true, and it
    leaves matchmaking as hivemind means it to. Call this before hivemind forks its averagers.

    Upstream issue: none found. Test: ``tests/integration/test_cancelled_rounds.py`` (the race made certain
    with a delayed state write; without the fix a cancelled round averages with a groupmate).
    """
    cancel = StepControl.cancel
    if getattr(cancel, _MARK, False):
        return

    @functools.wraps(cancel)
    def cancel_then_signal(self: StepControl) -> bool:
        cancelled = MPFuture.cancel(self)  # the state the averager reads, first
        if self._cancel is not None and not self._cancel.done():
            self._cancel.set_result(None)
        if self._trigger is not None:
            self._trigger.cancel()
        return cancelled

    setattr(cancel_then_signal, _MARK, True)
    StepControl.cancel = cancel_then_signal  # type: ignore[method-assign]


# -- inter-process locks of forked peers ----------------------------------------------------------------


def own_mpfuture_locks() -> None:
    """Give this process, and the processes it forks from now on, hivemind's inter-process locks of its own.

    Upstream behaviour (hivemind 1.1.12): ``MPFuture`` and ``SharedBytes`` serialise their writes, and
    ``hivemind.utils.asyncio`` the start of a process's executor, with ``multiprocessing`` locks made when
    hivemind is imported, so every process forked from the importing one shares them, whatever its role.
    A process killed (SIGKILL) while it holds one, which it does for each future it creates and each
    result it sends, leaves it held for good: every other process of that family then blocks at its next
    future, and a DHT started by any of them never reports ready. Peers forked from one process (the
    local-swarm example, the benchmarks, the local launcher's fork server) and killed one at a time are
    such a family: in ``bench/time_to_accuracy.py``, whose parent started a DHT of its own before forking
    its peers, the next trial's DHT hung after the previous trial's peers were killed (CI: the benchmark
    never ended); a local worker forked after one was killed with ``kill -9`` stood still at its DHT's
    start (CI: a run's replacement never trained).

    Call it first thing in a forked peer, before it uses hivemind: hivemind's own ``reset_backend`` makes
    fresh locks for futures, this the executor's, which the peer's DHT and averagers (forked from it)
    then share with it and no one else.

    Upstream issue: none found. Tests: ``tests/integration/test_forked_peer_locks.py``,
    ``tests/integration/test_local_preload.py``.
    """
    MPFuture.reset_backend()
    hivemind_asyncio._AsyncContextWrapper.EXECUTOR_LOCK = mp.Lock()


#: how long an averager's matchmaking waits for one DHT call (a healthy one takes well under a second)
MATCHMAKING_DHT_TIMEOUT_S = 10.0


def bound_matchmaking_dht_calls() -> None:
    """Give up an averager's matchmaking DHT call after :data:`MATCHMAKING_DHT_TIMEOUT_S` (idempotent).

    Upstream behaviour (hivemind 1.1.12): ``GroupKeyManager.declare_averager`` and ``get_averagers`` await
    their DHT request without a timeout, while the averager holds its matchmaking lock (the last
    ``declare_averager``, which marks the averager as no longer looking, runs in the clean-up that
    releases it). A request the DHT never answers (dropped as :func:`survive_unreadable_requests`
    describes, or a DHT that stopped reading) then holds the lock for the rest of the run: every later
    round logs "Another look_for_group is already in progress", then "could not find a group", and the
    peer trains alone. Bounded, a lost call counts as a declaration the DHT refused (``False``) or as no
    averagers found (``[]``), both outcomes hivemind already handles, and the lock is released. Call
    this before hivemind starts (forks) its averagers: the averager processes inherit the change.

    The bound is ``asyncio.timeout``, not ``asyncio.wait_for``: on Python 3.11, ``wait_for`` swallows a
    cancellation that arrives as the call it waits on completes (it returns the call's result instead).
    The averager cancels its matchmaking search as soon as a group is assembled; a search task that
    swallowed that cancellation went on to wait for the round's deadline, and the leader with it, so its
    groupmate, already in the all-reduce, left it out after ``next_chunk_timeout`` and the leader's
    trainer waited out ``averaging_timeout`` (``Reducer: received 50.0% of input tensors`` on both sides,
    one of them seconds later: the swarm stalls the benchmarks and the training tests met).

    Upstream issue: none found (learning-at-home/hivemind#519 reports the same "could not find a group"
    message, undiagnosed). Tests: ``tests/integration/test_hivemind_fixes.py``.
    """
    if getattr(GroupKeyManager.declare_averager, _MARK, False):
        return
    bounded = _within_bound(GroupKeyManager.declare_averager, "declaration", bool)
    GroupKeyManager.declare_averager = bounded  # type: ignore[method-assign]
    GroupKeyManager.get_averagers = _within_bound(GroupKeyManager.get_averagers, "search", list)  # type: ignore[method-assign]


def _within_bound(method: Callable[..., Any], what: str, fallback: Callable[[], Any]) -> Callable[..., Any]:
    """``method`` (an async ``GroupKeyManager`` method), answering ``fallback()`` after the bound."""

    @functools.wraps(method)
    async def within_bound(self: GroupKeyManager, *args: Any, **kwargs: Any) -> Any:
        try:
            async with asyncio.timeout(MATCHMAKING_DHT_TIMEOUT_S):  # a cancellation from outside stays one
                return await method(self, *args, **kwargs)
        except TimeoutError:
            log.warning(
                "averager %s: no DHT answer to its %s in %.0f s", self.prefix, what, MATCHMAKING_DHT_TIMEOUT_S
            )
            return fallback()

    setattr(within_bound, _MARK, True)
    return within_bound


#: the least time between two reads of the averagers declared under a group key, by one averager
MIN_GROUP_LOOKUP_INTERVAL_S = 0.05
_NEXT_LOOKUP_AT = "_spotswarm_next_lookup_at"
_PACED = "_spotswarm_paced"


def pace_group_lookups() -> None:
    """Space an averager's reads of its group key at least :data:`MIN_GROUP_LOOKUP_INTERVAL_S` apart
    (idempotent).

    Upstream behaviour (hivemind 1.1.12): while an averager looks for a group, its matchmaking reads the
    averagers declared under its group key (``GroupKeyManager.get_averagers``, a DHT get) and, whenever it
    has no leader left to try (the common case while the group forms: it waits for followers), asks for
    the next read at once. Each read is a DHT lookup: requests to the peers nearest the key, each signed
    and checked when the swarm admits by token. Measured with two local peers training the digits
    example (``python -m worker.examples.local_swarm``, 30 s): about 15,500 reads, some 260 a second per
    peer, and the DHT processes and ``p2pd`` daemons that serve them were most of the swarm's CPU beside
    training. Paced, a leader declared meanwhile is seen at most this much later: a twentieth of the 1 s
    ``matchmaking_time`` of the tests, a hundredth of the strategy's default. Call this before hivemind
    starts (forks) its averagers.

    Upstream issue: none found. Tests: ``tests/integration/test_hivemind_fixes.py``.
    """
    if getattr(GroupKeyManager.get_averagers, _PACED, False):
        return
    read = GroupKeyManager.get_averagers

    @functools.wraps(read)
    async def paced(self: GroupKeyManager, *args: Any, **kwargs: Any) -> Any:
        wait_s = getattr(self, _NEXT_LOOKUP_AT, 0.0) - time.monotonic()
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        try:
            return await read(self, *args, **kwargs)
        finally:
            setattr(self, _NEXT_LOOKUP_AT, time.monotonic() + MIN_GROUP_LOOKUP_INTERVAL_S)

    setattr(paced, _PACED, True)
    GroupKeyManager.get_averagers = paced  # type: ignore[method-assign]


def finalize_running_groups_on_shutdown() -> None:
    """Make averagers end the rounds they are in when they shut down, instead of dying (idempotent).

    Upstream behaviour (hivemind 1.1.12, ``DecentralizedAverager._shutdown``): for each group the averager
    is averaging with, shutdown calls ``finalize`` on what it registered, which is an ``asyncio.Future``
    of the group's all-reduce runner, not the runner: ``AttributeError``. So a worker that leaves while one
    of its averagers is in a round (a stop, a spot notice, the run's target reached as its groupmates
    still average) logs a traceback from the averager's thread, and the round is never ended on its side.
    Here each runner that exists is finalized as cancelled, as hivemind meant, and a group whose runner
    was not made yet has its future cancelled, so that a groupmate's request waiting for it ends. Call
    this before hivemind starts (forks) its averagers: the averager processes inherit the change.

    Upstream issue: none found. Test: ``tests/integration/test_hivemind_fixes.py``.
    """
    original = averager_module.DecentralizedAverager._shutdown
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    async def shutdown_ending_rounds(self: Any, _timeout: float | None) -> None:
        # hivemind's timeout bounded a wait for its finalizers; finalizing is synchronous, none is left
        if not self.client_mode:
            await self.remove_p2p_handlers(self._p2p, namespace=self.prefix)
        for runner in list(self._running_groups.values()):
            if runner.done() and not runner.cancelled():
                runner.result().finalize(cancel=True)
            else:
                runner.cancel()

    setattr(shutdown_ending_rounds, _MARK, True)
    averager_module.DecentralizedAverager._shutdown = shutdown_ending_rounds  # type: ignore[method-assign]


def live_task_count() -> int:
    """How many tasks this process keeps referenced now (for tests)."""
    return len(_live_tasks)


# -- the optimizer's missing ``defaults`` --------------------------------------------------------------


def expose_defaults(optimizer: OptimizerT) -> OptimizerT:
    """Give ``optimizer`` the ``defaults`` of the torch optimizer it drives, as every torch optimizer has.

    Upstream behaviour (hivemind 1.1.12): ``hivemind.Optimizer`` subclasses ``torch.optim.Optimizer``
    without calling its ``__init__``, so ``defaults`` is missing, and Lightning code that reads it fails:
    a stock ``LearningRateMonitor`` crashed every worker with ``'Optimizer' object has no attribute
    'defaults'``. The dict is the wrapped optimizer's own (``param_groups`` is already hivemind's faithful
    view of its groups).

    Upstream issue: none found for ``hivemind.Optimizer`` (learning-at-home/hivemind#592, fixed by #593,
    was the same ``defaults`` problem in ``hivemind.moe``'s ``OptimizerWrapper``). Test:
    ``tests/integration/test_strategy_callbacks.py`` (the learning-rate monitor).
    """
    optimizer.defaults = optimizer.opt.defaults
    return optimizer


# -- the DHT's request from a process that already exited ---------------------------------------------


class _DeadSenderFilter(logging.Filter):
    """Turns one known-benign hivemind DHT error into a debug line (see :func:`quiet_dead_sender_errors`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, (OSError, EOFError)) and _raised_in_resource_sharer(exc):
            log.debug("DHT dropped a request from a process that already exited: %r %s", exc, _sender(exc))
            return False
        return True


def _sender(exc: BaseException) -> str:
    """The resource-sharer address and key the failed request pointed at (for the debug line)."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "detach":
            return str(getattr(tb.tb_frame.f_locals.get("self"), "_id", None))
        tb = tb.tb_next
    return "?"


def _raised_in_resource_sharer(exc: BaseException) -> bool:
    cause = exc.__cause__
    if cause is not None and _raised_in_resource_sharer(cause):
        return True  # re-raised by _RequestPipe
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith("resource_sharer.py"):
            return True
        tb = tb.tb_next
    return False


class _RequestPipe:
    """The DHT process's end of hivemind's request pipe; ``recv`` turns ``EOFError`` into
    ``ConnectionResetError`` (see :func:`survive_unreadable_requests`). Everything else is the pipe's."""

    def __init__(self, pipe: Any) -> None:
        self._pipe = pipe

    def recv(self) -> Any:
        try:
            return self._pipe.recv()
        except EOFError as exc:
            raise ConnectionResetError(
                "the sender of a DHT request hung up before its reply pipe was fetched"
            ) from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe, name)


def survive_unreadable_requests(dht: Any) -> None:
    """Call first thing in the DHT's process (``run``), before hivemind's request loop starts.

    Upstream behaviour (hivemind 1.1.12, ``DHT.run``): each request unpickles a pipe end fetched from the
    sender's ``multiprocessing`` resource sharer. When the sender's sharer hangs up during the handshake
    (its process exits, or, now and then under load, while it lives), ``recv`` raises ``EOFError``; the
    loop catches ``OSError``, ``ConnectionError`` and ``RuntimeError`` only, so the DHT process dies with
    a traceback, and every later DHT call of that peer waits forever (its progress reads and reports, its
    averagers' matchmaking). As a ``ConnectionResetError`` the loop logs the request as lost (filtered
    to a debug line by :func:`quiet_dead_sender_errors`) and serves the next one. Only that request's
    reply is lost; its sender's own timeout covers it (an averager's matchmaking had none:
    :func:`bound_matchmaking_dht_calls`).

    Upstream issue: none found in learning-at-home/hivemind.
    Test: ``tests/integration/test_hivemind_fixes.py``.
    """
    dht._inner_pipe = _RequestPipe(dht._inner_pipe)


_DEAD_SENDER_FILTER = _DeadSenderFilter()


def quiet_dead_sender_errors() -> None:
    """Install ``_DeadSenderFilter`` on hivemind's DHT logger (idempotent; inherited by forked DHTs).

    Upstream behaviour (hivemind 1.1.12): every request to the DHT process carries a pipe end that the
    DHT fetches from the *sender's* ``multiprocessing`` resource sharer. When an averager process exits
    right after its last request (it does, at shutdown), fetching fails with ``FileNotFoundError`` and
    hivemind logs a traceback, although only the reply to a process that no longer exists is lost.
    ``shutdown.py`` makes this rare (it drains the DHT before the averagers stop); this filter turns what
    is left into a debug line. The record is recognised by its exception type and by the traceback
    passing through ``multiprocessing``'s ``resource_sharer.py``.

    Upstream issue: none found in learning-at-home/hivemind. Test:
    ``tests/integration/test_swarm_training.py`` (peers leave without a traceback in their logs).
    """
    install_filter("hivemind.dht.dht", _DEAD_SENDER_FILTER)


# -- a round that finishes after its step was cancelled -----------------------------------------------


class _CancelledRoundFilter(logging.Filter):
    """Drops asyncio's "never retrieved" record of an averaging round whose step had been cancelled."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, InvalidStateError) and "future that is CANCELLED" in str(exc):
            log.debug("an averaging round finished after its step was cancelled: %s", exc)
            return False
        return True


_CANCELLED_ROUND_FILTER = _CancelledRoundFilter()


def quiet_cancelled_rounds() -> None:
    """Install ``_CancelledRoundFilter`` on asyncio's logger (idempotent; inherited by forked averagers).

    Upstream behaviour (hivemind 1.1.12): a pre-scheduled round cancelled just as it found its group
    races inside the averager's process: its ``_step`` then sets the result of the cancelled step, and
    asyncio logs "Task exception was never retrieved" with an ``InvalidStateError``. The result was no
    longer wanted. Call this before the averagers fork, so that they inherit it.

    Upstream issue: none found. Test: ``tests/unit/test_swarm_log_filters.py``.
    """
    install_filter("asyncio", _CANCELLED_ROUND_FILTER)


# -- the progress tracker's abandoned event loop ------------------------------------------------------


def quiet_abandoned_event_loops() -> None:
    """Keep hivemind's abandoned event loops from logging errors when the process exits.

    Upstream behaviour (hivemind 1.1.12): the progress tracker's thread stops its event loop right after
    cancelling its last tasks, so they stay pending, and asyncio logs "Task was destroyed but it is
    pending!" when they are finally collected (at interpreter exit). Loops that are neither running nor
    closed but still have pending tasks are abandoned; they get a handler that drops just that message.
    Call it after the optimizer has shut down.

    Upstream issue: none found (learning-at-home/hivemind#427 fixed another "destroyed but pending" task,
    before 1.1.12). Test: ``tests/integration/test_swarm_training.py`` (peers leave without a traceback
    in their logs).
    """
    pending = [obj for obj in gc.get_objects() if type(obj) is asyncio.Task and not obj.done()]
    for loop in {task.get_loop() for task in pending}:
        if not loop.is_running() and not loop.is_closed():
            loop.set_exception_handler(_drop_destroyed_pending_task)


def _drop_destroyed_pending_task(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    if str(context.get("message", "")).startswith("Task was destroyed but it is pending"):
        return
    loop.default_exception_handler(context)


# -- refused averaging calls ---------------------------------------------------------------------------


class _RefusalFilter(logging.Filter):
    """Drops hivemind's traceback of a handler call that failed with one of ``refusals``."""

    def __init__(self, refusals: tuple[type[BaseException], ...]) -> None:
        super().__init__()
        self.refusals = refusals

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, self.refusals)


def quiet_refusal_tracebacks(refusal: type[BaseException]) -> None:
    """Keep hivemind's P2P logger from logging a traceback for each handler call failing with ``refusal``
    (idempotent per type; inherited by forks).

    Upstream behaviour (hivemind 1.1.12): ``hivemind.p2p.p2p_daemon`` logs every handler that raises with
    its traceback. The averaging guard (``worker/admission/guard.py``) refuses a peer without a token by
    raising in the handler, and logs the refusal once itself; a stranger calling in a loop would
    otherwise fill the log with tracebacks. Recognised by exception type only.

    Upstream issue: none (hivemind logs failing handlers on purpose). The refusals themselves are tested
    in ``tests/integration/test_swarm_admission.py``; this filter has no test of its own.
    """
    p2p_logger = logging.getLogger("hivemind.p2p.p2p_daemon")
    for existing in p2p_logger.filters:
        if isinstance(existing, _RefusalFilter) and refusal in existing.refusals:
            return
    p2p_logger.addFilter(_RefusalFilter((refusal,)))


# -- p2pd out of the worker's process group ------------------------------------------------------------

#: prctl(2) option: the signal a process gets when the thread that forked it exits
_PR_SET_PDEATHSIG = 1


def p2pd_in_own_session() -> None:
    """Start the ``p2pd`` of this process (a DHT's) in a session of its own, ended with this process.

    Upstream behaviour (hivemind 1.1.12): ``P2P.create`` starts ``p2pd`` in the DHT process's process
    group. hivemind's processes ignore SIGINT, and ``p2pd`` inherits that, so a terminal's Ctrl-C spares
    them; SIGTERM ``p2pd`` cannot ignore, since hivemind's own shutdown stops it with SIGTERM. So a
    SIGTERM to a worker's whole process group (systemd's default stop, ``kill -- -PGID``) ended ``p2pd``
    at once, with hivemind's other processes, and the worker's orderly leave (final checkpoint, goodbye
    to its peers) then failed on them, or a training step waited forever on one of them until the
    watchdog ended the worker (``docs/concepts/workers.md``). In a session of its own, ``p2pd`` gets only
    hivemind's SIGTERM, and the kernel's parent-death signal (SIGKILL) ends it with this process however
    that ends, as the group's SIGKILL did before. The worker agent has its forked processes let such
    signals pass (``worker/agent/agent.py``).

    Call it in the DHT's process before it starts ``p2pd``, on the thread that starts it (the death
    signal follows that thread): ``LifelineDHT.run``. Upstream issue: none found. Tests:
    ``tests/integration/test_agent_lifeline.py``.
    """
    subprocess_module = asyncio.subprocess
    spawn = subprocess_module.create_subprocess_exec
    parent = os.getpid()
    libc = ctypes.CDLL(None)  # loaded here, not in the child between fork and exec

    def die_with_parent() -> None:  # in the child, between fork and exec
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent was already gone before the line above
            os._exit(1)

    def spawn_p2pd_apart(program: Any, *args: Any, **kwargs: Any) -> Any:
        if os.path.basename(str(program)) == "p2pd":
            kwargs.setdefault("start_new_session", True)
            kwargs.setdefault("preexec_fn", die_with_parent)
        return spawn(program, *args, **kwargs)

    subprocess_module.create_subprocess_exec = spawn_p2pd_apart  # type: ignore[assignment]
