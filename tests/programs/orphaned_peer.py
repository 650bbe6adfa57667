"""Train a lone peer whose hivemind processes are all ended by a signal mid-fit, as a SIGTERM to a worker's
whole process group ends them, then leave as the worker would.

``python -m tests.programs.orphaned_peer <seconds>``: after two steps every process this one forked (the
DHT, the averagers, their ``p2pd``) gets SIGTERM; once they are gone the fit is asked to stop, and the
strategy's teardown runs with nothing of hivemind left to talk to. Prints one JSON line once the fit
ended, ``{"tracker_alive": bool}``, then returns from ``main``: the interpreter's own
shutdown (which joins every thread a ``concurrent.futures`` executor started) must end the process.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from tests.support.strategy import digits, make_strategy, make_trainer
from worker.examples.digits import DigitsModule
from worker.lifeline import descendants, signal_all
from worker.strategy import HivemindStrategy

KILL_AT_STEP = 2


class EndHivemind(Callback):
    """SIGTERM to every descendant at step ``KILL_AT_STEP``, then a stop once they are gone."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        if trainer.global_step != KILL_AT_STEP:
            return
        victims = signal_all(descendants(os.getpid()), signal.SIGTERM)
        deadline = time.monotonic() + self.wait_s
        while any(os.path.exists(f"/proc/{pid}") and _alive(pid) for pid in victims):
            if time.monotonic() > deadline:
                raise SystemExit(f"hivemind's processes outlived SIGTERM: {victims}")
            time.sleep(0.05)
        trainer.should_stop = True


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def main() -> None:
    wait_s = float(sys.argv[1])
    strategy: HivemindStrategy = make_strategy(target_batch_size=32)
    ender = EndHivemind(wait_s)
    make_trainer(strategy, callbacks=[ender], max_steps=50).fit(DigitsModule(), digits(batch_size=32))
    tracker = strategy.optimizer.tracker
    tracker.join(wait_s)
    print(json.dumps({"tracker_alive": tracker.is_alive()}), flush=True)


if __name__ == "__main__":
    main()
