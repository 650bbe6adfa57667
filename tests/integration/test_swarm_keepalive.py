"""worker/_hivemind_compat.py: a cancelled task that nobody awaits still runs its clean-up."""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import os
from collections.abc import Callable

import hivemind.utils.asyncio as hivemind_utils_asyncio
import pytest
from hivemind.averaging import averager as averager_module

from worker._hivemind_compat import keep_alive_task_factory, keep_averager_tasks_alive, live_task_count


async def _orphaned_round(cleaned: list[str]) -> None:
    """A task that only the event loop knows of (as hivemind's called-off matchmaking task): it waits on
    a future that nothing else refers to, then is cancelled; its clean-up needs the loop once more."""

    async def matchmaking() -> None:
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            await asyncio.sleep(0)  # e.g. telling the followers to go before releasing the lock
            cleaned.append("clean-up ran")

    asyncio.create_task(matchmaking())  # noqa: RUF006 - dropped on purpose: that is the case under test
    await asyncio.sleep(0)
    gc.collect()
    for task in asyncio.all_tasks():
        if task is not asyncio.current_task():
            task.cancel()
    for _ in range(5):
        await asyncio.sleep(0)


def _run(factory: Callable[..., asyncio.Future[object]] | None) -> list[str]:
    cleaned: list[str] = []
    loop = asyncio.new_event_loop()
    try:
        loop.set_task_factory(factory)  # type: ignore[arg-type]
        loop.run_until_complete(_orphaned_round(cleaned))
    finally:
        loop.close()
    return cleaned


@pytest.mark.timeout(30)
def test_a_task_that_nobody_holds_survives_collection_and_finishes_its_clean_up() -> None:
    assert _run(keep_alive_task_factory) == ["clean-up ran"]
    assert live_task_count() == 0  # each task is let go once it is done


@pytest.mark.timeout(30)
# the destroyed coroutine cannot await its clean-up ("coroutine ignored GeneratorExit"): that is the failure
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_without_the_factory_the_garbage_collector_destroys_it_half_way() -> None:
    """The failure the factory prevents, shown with plain asyncio (the reason the module exists)."""
    assert _run(None) == []


def _loop_of_a_forked_averager() -> None:
    """In a forked process, as an averager does: make its event loop; exit 0 if it keeps its tasks."""
    loop = averager_module.switch_to_uvloop()
    os._exit(0 if loop.get_task_factory() is keep_alive_task_factory else 1)


@pytest.mark.timeout(30)
def test_the_averager_patch_is_installed_once_on_the_loop_its_process_makes() -> None:
    keep_averager_tasks_alive()
    patched = averager_module.switch_to_uvloop
    keep_averager_tasks_alive()
    assert averager_module.switch_to_uvloop is patched
    assert patched.__wrapped__ is hivemind_utils_asyncio.switch_to_uvloop  # hivemind's own function
    child = multiprocessing.get_context("fork").Process(target=_loop_of_a_forked_averager)
    child.start()
    child.join(20)
    assert child.exitcode == 0
