"""Workers with the default strategy options train one model: once their swarm has formed, at most a tenth
of their epochs are trained apart (``alone``, ``no_group``, ``timeout``, ``failed``) and every worker averages
in most of its own epochs. Four workers with nothing in ``strategy_options`` (DiLoCo rounds every 30 s, the
mode and interval new runs get); and in hivemind's gradient averaging (``sync: gradients``), four workers
with admission on (digits, ``target_batch_size`` 2048) and two with admission off, the configurations in
which a split swarm was reported (every epoch ``alone``).

An epoch ``downloaded`` is a straggler catching up: it missed the group by a moment (four workers on two
busy cores), found the swarm an epoch ahead and loaded its state, so it still holds the swarm's model. A
worker cut off for good would download (or train alone) every epoch: the per-worker share catches that.

Real `spotswarm serve` with the reconcile loop and local digits workers (the tests' steadily paced digits,
``tests/support/paced_digits.py``; the options are the defaults): one for the module's cases, each
with a run of its own, stopped and its workers killed as the case ends. The share is counted from the
moment each worker has averaged once: epochs a worker trains before its partners are up are ``alone`` by
necessity, not a split.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import api
from tests.support.orchestrator import LOOP_ENV, Orchestrator, OrchestratorFactory
from tests.support.runs import RunReader, admin_post, digits_run, kill_local_workers, runs_stopped_after
from tests.support.waiting import BOOT_S, wait_until
from worker.protocol.workers import AVERAGING_OUTCOMES

pytestmark = [pytest.mark.swarm]
ENV = {"SPOTSWARM_CHECK_IMPORTS": "false"}
#: epochs (DiLoCo: rounds, 30 s each) measured per worker after the swarm formed (in DiLoCo, the round in
#: which all four had averaged, then the next); a gradient epoch takes at least 5 s with the default
#: matchmaking
EPOCHS_PER_WORKER = {"diloco": 1, "gradients": 6}
APART = ("alone", "no_group", "timeout", "failed")  # epochs whose gradients no other peer saw
APART_SHARE = 0.1  # of all epochs, at most
WORKER_AVERAGED_SHARE = 0.5  # of each worker's own epochs, at least


@pytest.fixture(scope="module")
def module_loop_orch(orchestrator_factory: OrchestratorFactory) -> Iterator[Orchestrator]:
    """One `spotswarm serve` with the reconcile loop for the module's cases; killed at the end, then every
    local worker it started."""
    orch = orchestrator_factory({**LOOP_ENV, **ENV})
    try:
        yield orch
    finally:
        orch.kill()  # first, so that its loop launches nothing more
        kill_local_workers(orch.data_dir)


@pytest.fixture
def orch(module_loop_orch: Orchestrator) -> Iterator[Orchestrator]:
    with runs_stopped_after(module_loop_orch) as shared:
        yield shared


def _counts(worker: dict[str, Any]) -> dict[str, int]:
    """A worker's epochs by outcome (not its group sizes or seconds)."""
    return {
        key: int(value) for key, value in (worker["averaging"] or {}).items() if key in AVERAGING_OUTCOMES
    }


def _by_worker(workers: list[dict[str, Any]]) -> dict[int, dict[str, int]]:
    return {worker["id"]: _counts(worker) for worker in workers}


def _all_averaged_once(reader: RunReader, workers: int) -> list[dict[str, Any]] | None:
    running = reader.running()
    formed = len(running) == workers and all((w["averaging"] or {}).get("averaged", 0) > 0 for w in running)
    return running if formed else None


@pytest.mark.timeout(420)
@pytest.mark.parametrize(
    ("workers", "target_batch_size", "options"),
    [
        (4, 2048, {}),
        (4, 2048, {"sync": "gradients"}),
        (2, 256, {"sync": "gradients", "swarm_admission": False}),
    ],
    ids=["four-default", "four-gradients", "two-gradients-admission-off"],
)
def test_workers_with_default_options_average_nearly_every_epoch(
    orch: Orchestrator,
    request: pytest.FixtureRequest,
    workers: int,
    target_batch_size: int,
    options: dict[str, Any],
) -> None:
    name = f"defaults-{request.node.callspec.id}"  # a run of its own on the shared orchestrator
    spec = digits_run(
        name, target_batch_size=target_batch_size, strategy_options=options, desired_workers=workers
    )
    admin_post(orch, api.runs(), spec)
    reader = RunReader(orch, name)
    formed = wait_until(
        lambda: _all_averaged_once(reader, workers),
        BOOT_S,
        interval_s=1.0,
        message=lambda: f"each of {workers} workers averaged once: {reader.running()}",
    )
    before = _by_worker(formed)

    def window() -> dict[int, dict[str, int]]:
        """Each worker's epochs by outcome since the swarm formed."""
        after = _by_worker(reader.running())
        return {
            worker: {key: counts[key] - before.get(worker, {}).get(key, 0) for key in counts}
            for worker, counts in after.items()
        }

    def total(per_worker: dict[int, dict[str, int]]) -> int:
        return sum(sum(counts.values()) for counts in per_worker.values())

    sync = reader.run()["sync"]
    assert sync == options.get("sync", "diloco"), "a run that names no mode trains in DiLoCo's rounds"
    wanted = EPOCHS_PER_WORKER[sync] * workers
    per_worker = wait_until(
        lambda: (w := window()) and total(w) >= wanted and w,
        180,
        interval_s=1.0,
        message=lambda: f"{wanted} worker-epochs: {window()}",
    )
    epochs = total(per_worker)
    apart = sum(counts.get(key, 0) for counts in per_worker.values() for key in APART)
    print(f"outcomes {per_worker} over {epochs} worker-epochs; load average {os.getloadavg()[0]:.1f}")
    assert set(per_worker) == set(before), "the same workers throughout: no churn in this test"
    assert apart <= APART_SHARE * epochs, per_worker
    for worker, counts in per_worker.items():
        assert counts["averaged"] >= WORKER_AVERAGED_SHARE * sum(counts.values()), (worker, per_worker)
    assert reader.run()["averaging"]["warning"] is None
