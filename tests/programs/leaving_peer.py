"""Train a lone peer on a DHT it is given, as the worker agent does, then print what that DHT holds.

``python -m tests.programs.leaving_peer keep|withdraw <steps>`` trains ``<steps>`` swarm epochs (one a
step) with ``keep_progress_record`` set as asked, and prints the run's progress entries the DHT holds
once the fit and the strategy's teardown ended: one JSON line, ``{"entries": [...]}``, each entry null
(withdrawn) or its epoch, ``{"epoch": N}``.

A fresh interpreter per case, so that nothing of other tests' hivemind peers is shared with it.
"""

from __future__ import annotations

import json
import sys

import hivemind

from tests.support.dht_reads import read_latest
from tests.support.strategy import FAST_SWARM, digits, make_trainer
from worker.examples.digits import DigitsModule
from worker.strategy import HivemindStrategy

RUN_ID = "leaving"


def main() -> None:
    keep, steps = sys.argv[1] == "keep", int(sys.argv[2])
    dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    try:
        options = {k: v for k, v in FAST_SWARM.items() if k != "host_maddrs"}
        strategy = HivemindStrategy(target_batch_size=32, run_id=RUN_ID, dht=dht, **options)
        strategy.keep_progress_record = keep
        make_trainer(strategy, max_steps=steps).fit(DigitsModule(), digits(batch_size=32))
        found = read_latest(dht, f"{RUN_ID}_progress")
        values = [entry.value for entry in dict(found.value).values()] if found is not None else []
        entries = [None if value is None else {"epoch": value["epoch"]} for value in values]
        print(json.dumps({"entries": entries}), flush=True)
    finally:
        dht.shutdown()


if __name__ == "__main__":
    main()
