"""What the run's code learns about its worker (worker/context.py)."""

from __future__ import annotations

import os

import pytest

from worker import context


def test_each_worker_gets_its_own_sampling_seed_reproducibly() -> None:
    seeds = {context.sampling_seed(str(worker_id), "42") for worker_id in range(100)}
    assert len(seeds) == 100  # no two workers shuffle alike
    assert context.sampling_seed("7", "42") == context.sampling_seed("7", "42")
    assert context.sampling_seed("7", "42") != context.sampling_seed(
        "7", "43"
    )  # the user's seed still counts
    assert all(0 <= seed < 2**32 for seed in seeds)


def test_the_context_is_published_at_registration_and_the_count_follows_heartbeats(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in (context.WORKER_ID_ENV, context.WORKER_INDEX_ENV, context.NUM_WORKERS_ENV):
        monkeypatch.setenv(name, "")  # then restored after the test, whatever publish sets
        monkeypatch.delenv(name)
    assert context.current_worker() is None  # not under the agent
    context.publish("12", 3, 4)
    assert context.current_worker() == context.WorkerContext("12", 3, 4)
    context.set_live_count(6)
    context.set_live_count(None)  # a reply that does not say keeps the last count
    assert context.current_worker() == context.WorkerContext("12", 3, 6)
    assert os.environ[context.NUM_WORKERS_ENV] == "4"  # the environment holds the count at registration
