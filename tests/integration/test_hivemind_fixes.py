"""A real DHT peer on 127.0.0.1 keeps serving after a request it cannot read (hivemind 1.1.12's DHT
process died of the ``EOFError`` that ``multiprocessing`` raises when the sender's resource sharer hangs
up while the DHT fetches the request's reply pipe), an averager's matchmaking call to a DHT that never
answers ends, an averager looking for a group reads the DHT at a paced rate, and an averager shut down in
the middle of a round ends it instead of dying."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import threading
import time
from typing import Any

import hivemind
import pytest
import torch
from hivemind.averaging.control import AveragingStage
from hivemind.averaging.key_manager import GroupKeyManager
from hivemind.utils import get_dht_time

from tests.support.waiting import wait_until
from worker import _hivemind_compat
from worker._hivemind_compat import bound_matchmaking_dht_calls, finalize_running_groups_on_shutdown
from worker.strategy.dht import start_dht
from worker.strategy.keywords import averager_options

pytestmark = pytest.mark.swarm


def _sender_hung_up() -> None:
    """Unpickling this raises what fetching a pipe end from a sender that hung up raises."""
    raise EOFError


class UnreadableRequest:
    """A request argument whose unpickling in the DHT process fails like a vanished reply pipe."""

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return (_sender_hung_up, ())


@pytest.mark.timeout(60)
def test_the_dht_answers_the_next_request_after_one_it_could_not_read(lone_dht: hivemind.DHT) -> None:
    lone_dht.store("key", "value", expiration_time=get_dht_time() + 60, return_future=True).result(timeout=10)
    # sent as DHT.get sends its requests, with an argument the DHT process fails to unpickle
    lone_dht._outer_pipe.send(("_get", [], {"key": "key", "latest": False, "future": UnreadableRequest()}))
    found = lone_dht.get("key", latest=False, return_future=True).result(timeout=15)
    assert found is not None and found.value == "value"
    assert lone_dht.is_alive()


@pytest.mark.timeout(60)
def test_an_averagers_matchmaking_call_to_a_dht_that_never_answers_ends(
    lone_dht: hivemind.DHT, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an averager's matchmaking awaits its DHT calls while it holds its matchmaking lock: a request the
    # DHT never answers (lost, as above) must not hold that lock for the rest of the run
    monkeypatch.setattr(_hivemind_compat, "MATCHMAKING_DHT_TIMEOUT_S", 2.0)  # the bound, shortened
    bound_matchmaking_dht_calls()
    keys = GroupKeyManager(lone_dht, prefix="stuck_averager", initial_group_bits="", target_group_size=2)
    os.kill(lone_dht.pid, signal.SIGSTOP)  # a real DHT process that reads nothing any more
    try:
        started = time.monotonic()
        declared = asyncio.run(keys.declare_averager(keys.current_key, lone_dht.peer_id, get_dht_time() + 30))
        found = asyncio.run(keys.get_averagers(keys.current_key, only_active=True))
        took = time.monotonic() - started
    finally:
        os.kill(lone_dht.pid, signal.SIGCONT)
    assert declared is False and found == []
    assert took < 2 * 2.0 + 5


@pytest.mark.timeout(30)
def test_a_matchmaking_call_cancelled_as_its_answer_arrives_stays_cancelled() -> None:
    # hivemind's search loop asks the DHT for averagers, then waits until the round's deadline; the averager
    # cancels the loop as soon as a group is assembled. A cancellation that arrives as the DHT answers
    # must end the loop, or the leader sits out its own round until the deadline (seen: 9 s)
    async def search(answer: asyncio.Future[list[Any]]) -> None:
        ask = _hivemind_compat._within_bound(lambda _keys: answer, "search", list)
        await ask(None)
        await asyncio.sleep(30)  # the rest of the search, until the round's deadline

    async def cancelled_as_the_answer_arrives() -> tuple[bool, float]:
        answer: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        loop_task = asyncio.create_task(search(answer))
        await asyncio.sleep(0)  # the search asks
        answer.set_result([])  # the DHT answers...
        await asyncio.sleep(0)
        loop_task.cancel()  # ...as the group is assembled
        started = time.monotonic()
        ended, _ = await asyncio.wait({loop_task}, timeout=5)
        took = time.monotonic() - started
        loop_task.cancel()  # a search that went on is stopped here, so the test leaves nothing running
        return bool(ended) and loop_task.cancelled(), took

    cancelled, took = asyncio.run(cancelled_as_the_answer_arrives())
    assert cancelled and took < 1.0, f"the search went on after its cancellation ({took:.1f} s later)"


#: how long the averager below looks for a group no other averager joins
LOOKING_S = 3.0


def _group_reads_while_looking(dht: hivemind.DHT, monkeypatch: pytest.MonkeyPatch, paced: bool) -> int:
    """How many times an averager alone in its swarm reads its group key while it looks for a group for
    :data:`LOOKING_S` (counted in hivemind's own ``get_averagers``, under any pacing)."""
    reads = multiprocessing.get_context("fork").Value("i", 0)  # the averager is a forked process
    unpaced = GroupKeyManager.get_averagers
    while getattr(unpaced, _hivemind_compat._PACED, False):  # this process may have paced it already
        unpaced = unpaced.__wrapped__

    async def counted(self: GroupKeyManager, *args: Any, **kwargs: Any) -> Any:
        with reads.get_lock():
            reads.value += 1
        return await unpaced(self, *args, **kwargs)

    monkeypatch.setattr(GroupKeyManager, "get_averagers", counted)  # restored when the test ends
    if paced:
        _hivemind_compat.pace_group_lookups()
    averager = hivemind.DecentralizedAverager(
        [torch.zeros(10)],
        dht,
        prefix=f"looking_alone_{paced}",
        target_group_size=2,
        min_matchmaking_time=LOOKING_S,
        **averager_options(None, LOOKING_S),
        start=True,
    )
    try:
        with contextlib.suppress(Exception):  # no group forms: hivemind reports it its own way
            averager.step(timeout=LOOKING_S, allow_retries=False)
    finally:
        averager.shutdown()
    return int(reads.value)


@pytest.mark.timeout(90)
def test_an_averager_looking_for_a_group_reads_its_group_key_at_a_paced_rate(
    lone_dht: hivemind.DHT, monkeypatch: pytest.MonkeyPatch
) -> None:
    # at most one read per interval, with room for a search that ends a little after LOOKING_S
    bound = 1.5 * LOOKING_S / _hivemind_compat.MIN_GROUP_LOOKUP_INTERVAL_S
    # hivemind as shipped reads again as soon as it has no leader to try: here 2,251 reads in 3 s
    unpaced = _group_reads_while_looking(lone_dht, monkeypatch, paced=False)
    assert unpaced > 3 * bound, unpaced
    paced = _group_reads_while_looking(lone_dht, monkeypatch, paced=True)  # here 57
    assert 1 <= paced <= bound, (paced, unpaced)


def _averager(dht: hivemind.DHT, value: float, matchmaking_time: float) -> hivemind.DecentralizedAverager:
    return hivemind.DecentralizedAverager(
        [torch.full((1000,), value)],
        dht,
        prefix="leaving_mid_round",
        target_group_size=2,
        min_matchmaking_time=matchmaking_time,
        **averager_options(None, matchmaking_time),  # the request timeout a worker's averagers get
        allreduce_timeout=60.0,
        shutdown_timeout=15.0,
        start=True,
    )


#: rounds the test may start before one holds together until its all-reduce (under load a groupmate's
#: request can time out after the leader formed the group: the leader's all-reduce then fails at once)
ROUND_ATTEMPTS = 3


def _a_round_in_its_all_reduce(
    leaving: hivemind.DecentralizedAverager, staying: hivemind.DecentralizedAverager
) -> Any:
    """Start rounds of both averagers, the groupmate's tensors held so that its half cannot finish, until
    the leaving averager's round is in its all-reduce; return that round's step (tensors still held)."""
    for attempt in range(1, ROUND_ATTEMPTS + 1):
        staying.lock_averaged_tensors.acquire()  # as get_tensors(): the groupmate's half waits for them
        leaving_step = leaving.step(wait=False, timeout=60)
        staying_step = staying.step(wait=False, timeout=60)
        wait_until(
            lambda step=leaving_step: step.stage == AveragingStage.RUNNING_ALLREDUCE or step.done(),
            45,
            interval_s=0.05,
            message=f"the leaving averager begins a round (attempt {attempt})",
        )
        if not leaving_step.done():
            return leaving_step
        staying.lock_averaged_tensors.release()  # let the groupmate's half end, then start again
        with contextlib.suppress(Exception):
            staying_step.result(timeout=60)
    raise AssertionError(f"no round held together until its all-reduce in {ROUND_ATTEMPTS} attempts")


@pytest.mark.timeout(240)
def test_an_averager_shut_down_in_the_middle_of_a_round_leaves_without_a_traceback(
    lone_dht: hivemind.DHT, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the averager dies in its thread: print that as a worker's process would (pytest would keep it)
    monkeypatch.setattr(threading, "excepthook", threading.__excepthook__)
    # a worker leaves (its optimizer shuts its averagers down) while one of them averages with a peer:
    # hivemind's shutdown must end that round, not die on it
    finalize_running_groups_on_shutdown()
    second = start_dht(
        initial_peers=[str(a) for a in lone_dht.get_visible_maddrs()], host_maddrs=["/ip4/127.0.0.1/tcp/0"]
    )
    leaving = staying = None
    try:
        # the leaving averager leads (hivemind's leader is the peer whose search ends first; the leaving
        # one searches in 1 s windows, the groupmate in one of 5 s), so it is in the round even where the
        # groupmate's request times out before the leader's go-ahead reaches it, as under load: the
        # leader's round then stays open. Led by the groupmate, that race left the groupmate in a round
        # it could not end (its tensors are held below) and the leaving averager in none.
        leaving, staying = _averager(lone_dht, 1.0, 1.0), _averager(second, 3.0, 5.0)
        leaving_step = _a_round_in_its_all_reduce(leaving, staying)
        try:
            assert not leaving_step.done()  # the round waits for the groupmate's tensors
            leaving.shutdown()
            leaving_errors = capfd.readouterr().err
        finally:
            staying.lock_averaged_tensors.release()  # the groupmate's tensors, held by the helper
        assert "Traceback" not in leaving_errors
        assert leaving.exitcode == 0
    finally:
        for process in (leaving, staying, second):
            if process is not None and process.is_alive():
                process.shutdown()
