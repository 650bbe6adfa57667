"""Chaos: while a digits run trains (reconcile loop, local launcher), the orchestrator is killed (-9) once at
a random moment and restarted on the same data dir and ports, then workers are killed (-9) one at a time,
at random, every few seconds once the swarm is whole again (a replacement has caught up: were the last
peer holding the swarm's state killed, the swarm would by design restart from its last checkpoint).

The run trains in the mode new runs get: its spec names no sync mode, so it trains in DiLoCo rounds (the
tests' rounds of 2 s, ``ROUNDS``), and blows fall before, during and after rounds: a replacement joins by
downloading the global state and weighs 0 in its first round, a round whose groupmate dies is discarded,
and when the blows leave only replacements that have not averaged yet, these meet only each other (their
first round, without any weight, is discarded; from the next they average).

At the end the run has completed; the swarm epoch never went backwards, sampled throughout from the
workers' reports (through the orchestrator, per run and per worker) and from the DHT by an observer peer
of the test's own (which keeps sampling while the orchestrator is down; its readings count until the swarm
reaches its last epoch, when the workers withdraw their records as they leave); every checkpoint the database
records downloads with its recorded SHA-256; and no worker is left launching or running.

The orchestrator dies while both first workers train, far from the target: a run that *completes* while
the orchestrator is down loses its last epochs today (see docs/operations/runbooks.md, "Known gaps").

The test's own choices (when the orchestrator dies, the pauses, which worker each blow falls on) come from
a seed: ``SPOTSWARM_CHAOS_SEED``, random when unset. It is printed and named in every failure message;
setting it replays those choices (the system's own timing still varies from run to run).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import api
from tests.support.orchestrator import Orchestrator
from tests.support.processes import ManagedProcess, ProcessRegistry
from tests.support.runs import (
    RunReader,
    admin_post,
    digits_run,
    kill_worker,
    start_loop_orchestrator,
)
from tests.support.waiting import BOOT_S, wait_until
from worker.protocol.paths import CHECKSUM_HEADER

pytestmark = [pytest.mark.swarm]
#: the run's rounds (its swarm epochs). DiLoCo rounds fall on the swarm clock's 2 s boundaries
#: (``ROUNDS["sync_every_s"]``) whoever trains, so the run ends about 2 s x this after its first round,
#: whatever the blows do; the blows take a few seconds each (a replacement forks from the fork server and
#: catches up at once by downloading the state). On a 2-core machine at load 7-18 the last blow fell at
#: rounds 6-11 and the test took 62-85 s; in gradients mode (36 epochs of 1,024 samples) it took 143-202 s.
TARGET_EPOCHS = 24
WORKER_KILLS = 3
#: between two blows: a round or two, so that the blows fall at every moment of a round's cycle
PAUSE_S = (2.0, 4.0)


@dataclass
class ApiSampler:
    """Reads the run every half second through whichever orchestrator is current; keeps every reading."""

    name: str
    orch: Orchestrator
    reported: list[int] = field(default_factory=list)
    per_worker: dict[str, list[int]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.wait(0.5):
            try:
                with httpx.Client(base_url=self.orch.url, timeout=5) as http:
                    run = http.get(api.run(self.name)).json()
                    workers = http.get(api.run_workers(self.name), params={"limit": 500}).json()
            except (httpx.HTTPError, ValueError):
                continue  # the orchestrator is down (killed on purpose) or busy: no reading this time
            self.reported.append(run["reported"]["swarm_epoch"])
            for worker in workers["items"]:
                self.per_worker.setdefault(worker["id"], []).append(worker["swarm_epoch"])


def start_observer(processes: ProcessRegistry, orch: Orchestrator, name: str) -> ManagedProcess:
    """A DHT peer of the test's own reading the swarm's progress (tests/programs/swarm_observer.py): an
    operator's monitoring peer, with a token it signs itself with the authority key in the data dir."""
    with orch.client() as http:
        run = http.get(api.run(name)).json()
        peers = http.get(api.run_peers(name)).json()["initial_peers"]
    args = [
        sys.executable,
        "-m",
        "tests.programs.swarm_observer",
        run["swarm_id"],
        str(run["spec"]["target_batch_size"]),
        str(orch.data_dir / "swarm_authority.pem"),
    ]
    proc = processes.start("swarm-observer", [*args, *peers], preloaded=True)
    wait_until(lambda: '"epoch"' in proc.log(), BOOT_S, message="the observer reads the swarm's epoch")
    return proc


def observed_epochs(proc: ManagedProcess) -> list[int]:
    lines = (json.loads(line) for line in proc.log().splitlines() if line.startswith("{"))
    return [line["epoch"] for line in lines if "epoch" in line]


def before_the_end(series: list[int], last_epoch: int) -> list[int]:
    """The readings up to the first one at ``last_epoch`` or later: in its last epoch the swarm stops, each
    worker's clean exit withdraws its progress record, and the DHT is left with the records of the
    workers killed on purpose (at older epochs) until they expire (60 s), so the epoch read then drops."""
    end = next((i for i, epoch in enumerate(series) if epoch >= last_epoch), len(series) - 1)
    return series[: end + 1]


def went_back(series: list[int]) -> list[tuple[int, int]]:
    """Each (before, after) pair where the series decreased."""
    return [(a, b) for a, b in itertools.pairwise(series) if b < a]


def verify_checkpoints(orch: Orchestrator, name: str) -> list[dict[str, Any]]:
    """Download every recorded checkpoint; each must match its recorded size and SHA-256."""
    with orch.admin() as http:
        items = http.get(api.run_checkpoints(name)).json()["items"]
        for item in items:
            response = http.get(item["download_path"])
            assert response.status_code == 200, (item, response.text)
            assert len(response.content) == item["size_bytes"], item
            digest = hashlib.sha256(response.content).hexdigest()
            assert digest == item["sha256"] == response.headers[CHECKSUM_HEADER], item
    return list(items)


def whole_swarm(reader: RunReader) -> tuple[str, list[dict[str, Any]]] | None:
    """The run's state and running workers, once the run has ended or 2 workers report the swarm's epoch,
    i.e. both hold the swarm's state. Not one epoch behind: a replacement starts from the run's last
    checkpoint, which may be just that, before it has the swarm's state (seen once: the only worker that
    had it was killed then, and the swarm went on from the checkpoint, its epoch going back 7 -> 4)."""
    state, epoch, running = reader.run()["state"], reader.epoch(), reader.running()
    synced = [w for w in running if (w["swarm_epoch"] or 0) >= epoch]
    return (state, running) if state != "running" or len(synced) >= 2 else None


def chaos_seed() -> int:
    """``SPOTSWARM_CHAOS_SEED``, or a fresh random seed."""
    chosen = os.environ.get("SPOTSWARM_CHAOS_SEED", "").strip()
    return int(chosen) if chosen else random.SystemRandom().randrange(2**32)


def pause(rng: random.Random) -> None:
    time.sleep(rng.uniform(*PAUSE_S))  # chaos is random by design: the pause is part of the experiment


@pytest.mark.timeout(420)
def test_random_worker_kills_and_an_orchestrator_kill_the_run_still_completes(
    processes: ProcessRegistry, loop_data_dir: Path
) -> None:
    seed = chaos_seed()
    replay = f"SPOTSWARM_CHAOS_SEED={seed} replays this test's choices"
    print(f"chaos seed {seed} ({replay})")
    rng = random.Random(seed)
    started = time.monotonic()
    orch = start_loop_orchestrator(processes, loop_data_dir)
    # no sync mode named: the run trains as new runs do (DiLoCo), in the tests' short rounds (ROUNDS)
    spec = digits_run("chaos", stop={"target_epochs": TARGET_EPOCHS})
    admin_post(orch, api.runs(), spec)
    reader = RunReader(orch, "chaos")
    # both samplers read from the swarm's first epoch: two workers that have not yet seen each other step
    # alone (at the usual digits settings an epoch in a fraction of a second), and once ran through 26 of
    # 30 epochs before an observer started after them read anything
    observer = start_observer(processes, orch, "chaos")
    sampler = ApiSampler("chaos", orch)
    threading.Thread(target=sampler.run, daemon=True).start()
    wait_until(
        lambda: len(reader.running()) == 2 and reader.epoch() >= 1,
        BOOT_S,
        message=f"2 workers train; {replay}",
    )
    print(f"{time.monotonic() - started:.1f} s: 2 workers train, epoch {reader.epoch()}")

    time.sleep(rng.uniform(0.0, 3.0))
    print(f"{time.monotonic() - started:.1f} s: orchestrator killed at epoch {reader.epoch()}")
    orch.kill()
    orch = start_loop_orchestrator(
        processes, loop_data_dir, port=orch.port, dht_port=orch.dht_port, name="orchestrator-2"
    )
    sampler.orch = reader.orch = orch
    killed = []
    for _ in range(WORKER_KILLS):
        pause(rng)
        # a blow falls only on a whole swarm: were the last peer holding the swarm's state killed before
        # its replacement had caught up, the swarm would restart from its last checkpoint (by design)
        state, victims = wait_until(
            lambda: whole_swarm(reader), BOOT_S, message=f"2 workers hold the state; {replay}"
        )
        if state != "running":
            break
        victim = rng.choice(victims)
        kill_worker(victim)
        killed.append(victim["id"])
        print(f"{time.monotonic() - started:.1f} s: worker {victim['id']} killed at epoch {reader.epoch()}")

    final = wait_until(
        lambda: (run := reader.run())["state"] in ("completed", "failed", "stopped") and run,
        300,
        message=f"the run completes after killing the orchestrator and workers {killed}; {replay}",
    )
    sampler.stop.set()
    print(f"{time.monotonic() - started:.1f} s: the run {final['state']} at epoch {reader.epoch()}")
    assert final["state"] == "completed", (final["state_reason"], replay)
    assert final["sync"] == "diloco", (final["sync"], replay)
    assert len(killed) == WORKER_KILLS, f"the run ended after {len(killed)} of {WORKER_KILLS} blows; {replay}"
    assert final["reported"]["swarm_epoch"] >= TARGET_EPOCHS, replay

    dht = before_the_end(observed_epochs(observer), TARGET_EPOCHS - 1)
    # enough to tell: the DHT readings span several epochs (how many readings that takes depends on
    # how fast the swarm ran through them), the API's cover the whole run
    unanswered = observer.log().count("no answer to read")  # tests/support/dht_reads.py notes each
    assert len(set(dht)) >= 5 and len(sampler.reported) > 20, (
        f"too few readings to tell: {dht} ({unanswered} DHT reads unanswered); {replay}"
    )
    assert not went_back(dht), f"the swarm epoch went back (DHT): {went_back(dht)}; {replay}"
    assert not went_back(sampler.reported), (sampler.reported, replay)
    backwards = {w: went_back(series) for w, series in sampler.per_worker.items() if went_back(series)}
    assert not backwards, (backwards, replay)

    assert verify_checkpoints(orch, "chaos"), f"no checkpoint kept; {replay}"
    wait_until(
        lambda: all(w["state"] not in ("launching", "running") for w in reader.workers()),
        60,
        message=f"no worker left live; {replay}",
    )
    launched = [e for e in reader.events() if e["kind"] == "worker.launched"]
    assert len(launched) >= 2 + len(killed) - 1, f"killed workers were replaced; {replay}"
