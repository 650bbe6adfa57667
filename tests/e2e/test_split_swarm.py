"""A fresh run's two workers train one model, not two, however late the orchestrator's DHT peer learns
that the run opted out of swarm admission.

The peer refuses peers without a swarm token unless it knows their run opted out; it used to learn that
only every ``dht_refresh_interval_s`` (here 10 minutes, so the first workers always come too early). A
worker whose bootstrap nobody answers either gives up (the agent's default) or, with
``ensure_bootstrap_success: false`` in the run's strategy options, trains alone: each worker then counted
one peer and applied every epoch on its own gradients (every epoch ``alone``, and the averaging warning),
for as long as the run lasted, since hivemind never contacts its initial peers again. Now the peer learns
of the opt-out before a worker of the run is told where it is, and a worker that lost or never met its
listed peers contacts them again (``worker/swarm_rejoin.py``).

Real `spotswarm serve` with the reconcile loop and two local digits workers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import api
from tests.support.processes import ProcessRegistry
from tests.support.runs import ROUNDS, RunReader, admin_post, digits_run, start_loop_orchestrator
from tests.support.waiting import BOOT_S, wait_until

pytestmark = [pytest.mark.swarm]
AVERAGED_EPOCHS = 3  # per worker: rounds that can only succeed between the two
ENV = {
    "SPOTSWARM_DHT_REFRESH_INTERVAL_S": "600",  # the periodic push of opted-out runs comes too late
    "SPOTSWARM_AVERAGING_WINDOW_S": "20",  # a split shows as the warning within a minute
    "SPOTSWARM_PROGRESS_SAMPLE_INTERVAL_S": "2",
    "SPOTSWARM_CHECK_IMPORTS": "false",
}


@pytest.mark.timeout(420)
def test_workers_of_an_opted_out_run_average_with_each_other_from_the_start(
    processes: ProcessRegistry, loop_data_dir: Path
) -> None:
    orch = start_loop_orchestrator(processes, loop_data_dir, extra_env=ENV)
    options = {
        **ROUNDS,
        "swarm_admission": False,
        "ensure_bootstrap_success": False,  # a worker nobody answers trains alone instead of giving up
    }
    admin_post(orch, api.runs(), digits_run("apart", strategy_options=options))
    reader = RunReader(orch, "apart")
    wait_until(lambda: len([w for w in reader.running() if w["samples"] > 0]) == 2, BOOT_S, message="2 train")

    def both_averaged() -> bool:
        workers = reader.running()
        return len(workers) == 2 and all(
            (w["averaging"] or {}).get("averaged", 0) >= AVERAGED_EPOCHS for w in workers
        )

    try:
        wait_until(
            both_averaged, 120, interval_s=1.0, message=f"each worker averaged {AVERAGED_EPOCHS} epochs"
        )
    except TimeoutError as exc:
        run = reader.run()
        raise AssertionError(f"{exc}: averaging {run['averaging']}, workers {reader.running()}") from exc
    assert all(w["num_peers"] == 2 for w in reader.running() if w["num_peers"] is not None), reader.running()
    assert reader.run()["averaging"]["warning"] is None
