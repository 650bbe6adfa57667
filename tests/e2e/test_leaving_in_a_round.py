"""A worker told to leave while it waits in an averaging round leaves at once, not at the round's end.

Real `spotswarm serve` with the reconcile loop and two local workers whose gradient rounds (or, in the
second case, state rounds) never find a group (``tests/e2e/lifecycle_models.py``: each looks under a key
of its own), so both sit in a round for ``averaging_timeout`` after every epoch, as peers do whose
groupmates are leaving or gone. A stop then
cancels the round each waits in (``HivemindStrategy.leave_averaging``); before, each worker left only
when its round timed out.
"""

from __future__ import annotations

import time

import pytest

from tests.support import api
from tests.support.orchestrator import Orchestrator
from tests.support.runs import GRADIENTS, RunReader, admin_post, digits_run
from tests.support.waiting import BOOT_S, wait_until

pytestmark = pytest.mark.swarm
MODELS = "tests.e2e.lifecycle_models"
AVERAGING_TIMEOUT_S = 60.0
#: heartbeat (1 s), the cancelled round's end, a final checkpoint, leaving the swarm: seconds, on a busy
#: machine too. Without the cancellation the agent's own bound ends it: 15 s after the stop request it
#: leaves whatever its trainer does (``worker/agent/agent.py``)
LEFT_WITHIN_S = 10.0
#: a swarm epoch that has not moved for this long, its batch full, is waiting in a round (an epoch of
#: these workers takes a fraction of a second, a round that forms about one matchmaking_time)
WAITING_S = 5.0


class _EpochStill:
    """Whether an epoch has stood still for ``seconds``, from the polls that saw it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.epoch: int | None = None
        self.since = 0.0

    def still(self, epoch: int) -> bool:
        now = time.monotonic()
        if epoch != self.epoch:
            self.epoch, self.since = epoch, now
        return now - self.since >= self.seconds


#: the rounds the workers wait in: the model that keeps them apart there, and its strategy options
ROUNDS = {
    # rounds hivemind schedules ahead of each epoch's end; no state round, whose averagers are not kept
    # apart: two that met in one would average, and a round already averaging runs to its end, so the
    # one whose groupmate left first waited there (seen once, 16 s)
    "gradient": ("ApartDigitsModule", {"average_state_every": 1_000}),
    # a round hivemind starts itself at the epoch's start (``worker/strategy/optimizer.py StateAverager``)
    "state": ("ApartStateDigitsModule", {"average_state_every": 1}),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("rounds", list(ROUNDS))
def test_a_stop_ends_the_rounds_its_workers_wait_in(loop_orch: Orchestrator, rounds: str) -> None:
    orch, name = loop_orch, f"apart-{rounds}"
    model, extra_options = ROUNDS[rounds]
    options = {**GRADIENTS, "averaging_timeout": AVERAGING_TIMEOUT_S, **extra_options}
    spec = digits_run(name, module=f"{MODELS}:{model}", strategy_options=options)
    spec["datamodule"] = f"{MODELS}:DigitsDataModule"
    admin_post(orch, api.runs(), spec)
    reader = RunReader(orch, name)

    wait_until(
        lambda: [w["phase"] for w in reader.running()] == ["training", "training"],
        BOOT_S,
        message="two workers train",
    )
    # an epoch takes a fraction of a second; then each worker waits in its round for AVERAGING_TIMEOUT_S
    # with its epoch's samples done: the swarm (as the orchestrator reads the DHT) holds a full batch and
    # its epoch stands still for WAITING_S (a worker that reaches its first round late still waits in it
    # then). Not the reported rate: a record can keep the rate of its last update well into the wait.
    waiting = _EpochStill(WAITING_S)
    wait_until(
        lambda: (
            (swarm := reader.run()["swarm"]) is not None
            and swarm["num_peers"] == 2
            and swarm["samples_accumulated"] >= swarm["target_batch_size"]
            and waiting.still(swarm["epoch"])
        ),
        60,
        message=lambda: (
            f"both workers wait in their averaging rounds: the swarm as read {reader.run()['swarm']}\n"
            + "\n".join(f"worker {w['id']}:\n{reader.worker_log(w['id'])[-2000:]}" for w in reader.workers())
        ),
    )
    stopped_at = time.monotonic()
    admin_post(orch, api.run_stop(name))
    wait_until(lambda: reader.run()["state"] == "stopped", AVERAGING_TIMEOUT_S + 30, message="the run stops")
    took_s = time.monotonic() - stopped_at
    assert took_s < LEFT_WITHIN_S, f"the workers left {took_s:.0f} s after the stop"
    workers = reader.workers()
    assert len(workers) == 2 and all(w["state"] == "exited" for w in workers), workers
