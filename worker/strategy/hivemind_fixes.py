"""Keeps the tasks of hivemind's averager processes alive until they finish.

asyncio holds tasks by weak reference only. When a pre-scheduled averaging round is called off (hivemind
does that when a peer thinks it is alone, e.g. while the swarm forms, or when a state round is not
due), the averager cancels its matchmaking task without awaiting it. Nothing refers to that task any
more, so the garbage collector can destroy it before its clean-up ran ("Task was destroyed but it is
pending!"). That clean-up releases the averager's matchmaking lock; without it, every later round of that
averager waits on the lock until its timeout, and the peer trains on local gradients alone for the rest
of the run ("Averaging step failed: could not find a group", round after round, while its state
averager, run by the same peers, still forms groups). ``bench/matchmaking.py`` measures the difference.

The remedy is the one the asyncio documentation gives: keep a strong reference to every task until it is
done. The averager runs its own event loop in a forked process; the first averaging step there installs
a task factory on that loop that does so.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

from hivemind.averaging import DecentralizedAverager

_MARK = "_spotswarm_keeps_tasks_alive"
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
    """Make every averager created from now on keep its tasks referenced until done (idempotent).

    Call it before hivemind starts (forks) its averagers: the averager processes inherit the change.
    """
    original: Callable[..., Any] = DecentralizedAverager._step
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    async def step_keeping_tasks(self: DecentralizedAverager, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        if loop.get_task_factory() is None:
            loop.set_task_factory(keep_alive_task_factory)  # type: ignore[arg-type]
        return await original(self, **kwargs)

    setattr(step_keeping_tasks, _MARK, True)
    DecentralizedAverager._step = step_keeping_tasks  # type: ignore[method-assign]


def live_task_count() -> int:
    """How many tasks this process keeps referenced now (for tests)."""
    return len(_live_tasks)
