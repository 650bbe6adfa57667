"""A spot trace replayed through a real orchestrator and local workers: how much of the capacity the
market gave became training progress.

A `spotswarm serve` (reconcile loop, local launcher in a simulated spot market: ``local_spot_market``,
``docs/guides/spot-market.md``) trains the digits example with ``--slots`` desired workers while the
market replays ``--trace`` (Parcae's JSON lines or a CSV of capacity), ``--compress`` times faster than
real time. Every second it samples the market's capacity, the running workers and the run's progress:
samples in the model. In ``"gradients"`` mode, samples in completed swarm epochs; in DiLoCo, samples
in rounds whose outer step took them (the workers' ``kept_samples``: a discarded round, a joiner's
first round at zero weight and a round a worker left unfinished keep none). DiLoCo rounds come every
``--sync-every-s``, by default the product's 30 s compressed as the trace is, so that a round spans the
same share of the trace's churn as it would in real time. Then it prints:

- goodput: progress / the progress a steady swarm would have made with the capacity the market offered
  (at each moment, the swarm's steady rate for as many workers as were offered), where the steady rate
  of N workers is measured in this run over the seconds in which N ran and the market offered N (a
  separate control run is not made);
- lost work per preemption: in DiLoCo, each reclaimed worker's samples minus those it reported kept; in
  gradients mode, the run's samples in no completed or current epoch over the reclaims (an estimate);
- notice to replacement: from a reclaimed worker's end to the next worker's registration (median);
- zero-worker time: seconds after the first registration during which no worker ran;
- epoch rollbacks (the swarm's epoch in the DHT went back) and the states the run was seen in;
- a plot of capacity, running workers and progress over time (``replay.svg`` in ``--out``, written by
  hand: no plotting library is needed).

Its last line reads ``goodput <x> (mode <m>, slots <n>, compress <k>)``. ``--quick`` replays a built-in
five-minute trace on one slot in about a minute, to check that the script works: it measures
nothing at that size.

``python bench/spot_replay.py --trace FILE --slots N --compress K [--sync MODE] [--out DIR]``
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from orchestrator.launchers.spot_market import SpotMarket, SpotMarketSettings
from tests.support.processes import ProcessRegistry
from tests.support.runs import RunReader, admin_post, digits_run, kill_local_workers, start_loop_orchestrator
from worker.protocol.sync import DEFAULT_SYNC_EVERY_S, NEW_RUN_SYNC
from worker.protocol.workers import AVERAGING_OUTCOMES

SAMPLE_S = 1.0
QUICK_TRACE = "minute,capacity\n0,1\n2,0\n3,1\n5,1\n"  # one slot: lost at 2 min, back at 3


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, help="Parcae JSON lines or a CSV of time,capacity")
    parser.add_argument("--slots", type=int, default=2, help="workers at the trace's peak")
    parser.add_argument("--compress", type=float, default=10.0, help="trace seconds per wall second")
    parser.add_argument(
        "--sync", default=NEW_RUN_SYNC, choices=["gradients", "diloco"], help="the run's sync mode"
    )
    parser.add_argument(
        "--out", type=Path, help="folder for samples.json and replay.svg (default: a temporary one)"
    )
    parser.add_argument(
        "--sync-every-s", type=float, default=None, help="DiLoCo's round length (default: 30 s / --compress)"
    )
    parser.add_argument(
        "--cpus-per-worker",
        type=int,
        default=None,
        help="cores of its own for each worker (default: the machine's cores / --slots; 0: unpinned)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the market's seed")
    parser.add_argument("--kill-share", type=float, default=0.0, help="share of reclaims without notice")
    parser.add_argument(
        "--quick", action="store_true", help="a built-in 5-minute trace on 1 slot, compressed 10x"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    # a SIGTERM (a test's time-out, a kill) still stops the orchestrator and the workers: they run in
    # sessions of their own, which killing this process's group would leave behind
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="spotswarm-replay-") as tmp:
        work = Path(tmp)
        out = args.out or work
        out.mkdir(parents=True, exist_ok=True)
        if args.quick:
            args.trace, args.slots, args.compress = work / "quick.csv", 1, 10.0
            args.trace.write_text(QUICK_TRACE)
        if args.trace is None:
            raise SystemExit("--trace FILE is needed (or --quick)")
        settings = SpotMarketSettings(
            slots=args.slots, trace=args.trace.resolve(), compress=args.compress, seed=args.seed,
            kill_share=args.kill_share,
        )  # fmt: skip
        every_s = args.sync_every_s or max(1.0, DEFAULT_SYNC_EVERY_S / args.compress)
        cpus = args.cpus_per_worker
        if cpus is None:
            cpus = len(os.sched_getaffinity(0)) // settings.slots
        samples, workers = replay(settings, args.sync, every_s, cpus, work)
        setup = f"; rounds every {every_s:g} s" if args.sync == "diloco" else ""
        setup += f"; {cpus} core(s) per worker" if cpus else "; workers unpinned"
        report(samples, workers, settings, args.sync, setup, out)  # before the temporary folder goes


def replay(
    settings: SpotMarketSettings, sync: str, sync_every_s: float, cpus_per_worker: int, work: Path
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run the trace through a real orchestrator; the samples taken and the run's workers at the end."""
    market_file = work / "market.json"
    market_file.write_text(settings.model_dump_json())
    env = {
        "SPOTSWARM_LOCAL_SPOT_MARKET": str(market_file),
        "SPOTSWARM_CHECK_IMPORTS": "false",
        "SPOTSWARM_MAX_START_FAILURES": "1000",  # the most: a dry market is not a broken run
        "SPOTSWARM_LAUNCH_BACKOFF_BASE_S": "1",
        "SPOTSWARM_LAUNCH_BACKOFF_CAP_S": "4",
    }
    processes, data_dir = ProcessRegistry(work), work / "orch"
    schedule = SpotMarket(settings, time.time)  # the same trace, read here to know the capacity offered
    duration_s = schedule.end_s / settings.compress + 10 * SAMPLE_S
    try:
        orch = start_loop_orchestrator(processes, data_dir, extra_env=env)
        spec = digits_run(
            "replay", desired_workers=settings.slots, max_workers=max(4, settings.slots),
            stop={"target_epochs": 1_000_000}, checkpoint_every_epochs=1_000_000,
            launcher_options={"cpus_per_worker": cpus_per_worker} if cpus_per_worker else {},
            strategy_options={
                "matchmaking_time": 1.0, "averaging_timeout": 10.0, "sync": sync,
                **({"sync_every_s": sync_every_s} if sync == "diloco" else {}),
            },
        )  # fmt: skip
        admin_post(orch, "/api/v1/runs", spec)
        reader = RunReader(orch, "replay")
        schedule.capacity()  # the market's own trace starts at its first launch, about now
        samples = sample(reader, schedule, duration_s, sync)
        return samples, reader.workers()
    finally:
        processes.kill_all()
        kill_local_workers(data_dir)


def kept_of(worker: dict[str, Any]) -> int:
    """The samples a DiLoCo worker reported as kept in the model (0 before its first report)."""
    return int((worker["averaging"] or {}).get("kept_samples", 0))


def progress_of(run: dict[str, Any], workers: list[dict[str, Any]], sync: str) -> tuple[int, int]:
    """(samples in the model, samples computed and not yet in it or lost) for the run's mode. Gradients:
    whole swarm epochs of ``target_batch_size`` samples, and the swarm's current epoch. DiLoCo: the samples
    each worker reports as kept (in rounds its outer step applied with their weight), and nothing in
    flight (a round's samples are kept or lost at its end)."""
    if sync == "diloco":
        return sum(kept_of(w) for w in workers), 0
    in_flight = int((run.get("swarm") or {}).get("samples_accumulated", 0))
    return run["reported"]["swarm_epoch"] * run["spec"]["target_batch_size"], in_flight


def sample(reader: RunReader, market: SpotMarket, duration_s: float, sync: str) -> list[dict[str, Any]]:
    """One sample a second until the trace ends: capacity, running workers, progress."""
    samples: list[dict[str, Any]] = []
    started = time.monotonic()
    while time.monotonic() - started < duration_s:
        run = reader.run()
        swarm = run.get("swarm") or {}
        progress, in_flight = progress_of(run, reader.workers() if sync == "diloco" else [], sync)
        samples.append(
            {
                "t_s": time.monotonic() - started,
                "capacity": market.capacity(),
                "running": run["workers"]["running"],
                "progress": progress,
                "samples_total": run["reported"]["samples_total"],
                "in_flight": in_flight,
                "dht_epoch": swarm.get("epoch"),
                "state": run["state"],
            }
        )
        time.sleep(max(0.0, SAMPLE_S - (time.monotonic() - started - samples[-1]["t_s"])))
    return samples


def steady_rates(samples: list[dict[str, Any]]) -> dict[int, float]:
    """The swarm's progress per second for each worker count it held steadily: over the intervals in which
    that many workers ran and the market offered that many (a ratio of sums: progress comes in whole
    epochs or rounds, so one interval's rate says little). Measured per count, because N workers on one
    machine are not N times one worker."""
    progress: dict[int, float] = {}
    seconds: dict[int, float] = {}
    for before, after in itertools.pairwise(samples):
        count = before["running"]
        if after["running"] == count == before["capacity"] == after["capacity"] > 0:
            progress[count] = progress.get(count, 0.0) + max(0, after["progress"] - before["progress"])
            seconds[count] = seconds.get(count, 0.0) + after["t_s"] - before["t_s"]
    return {count: progress[count] / seconds[count] for count in sorted(seconds) if seconds[count] > 0}


def ideal_progress(samples: list[dict[str, Any]], rates: dict[int, float]) -> float:
    """The progress a steady swarm would have made with the capacity the market offered: at each moment,
    the steady rate of as many workers as were offered (a count never held steadily: the per-worker rate
    of the nearest count held, times the count)."""
    if not rates:
        return 0.0

    def rate(count: int) -> float:
        if count <= 0:
            return 0.0
        if count in rates:
            return rates[count]
        nearest = min(rates, key=lambda held: (abs(held - count), held))
        return rates[nearest] / nearest * count

    return sum(rate(a["capacity"]) * (b["t_s"] - a["t_s"]) for a, b in itertools.pairwise(samples))


def report(
    samples: list[dict[str, Any]],
    workers: list[dict[str, Any]],
    settings: SpotMarketSettings,
    sync: str,
    setup: str,
    out: Path,
) -> None:
    capacity_s = sum(a["capacity"] * (b["t_s"] - a["t_s"]) for a, b in itertools.pairwise(samples))
    first = next((i for i, s in enumerate(samples) if s["running"]), len(samples))
    after = samples[first:]
    zero_s = sum(b["t_s"] - a["t_s"] for a, b in itertools.pairwise(after) if a["running"] == 0)
    progress = samples[-1]["progress"] - samples[0]["progress"]
    rates = steady_rates(samples)
    ideal = ideal_progress(samples, rates)
    goodput = progress / ideal if ideal > 0 else 0.0
    reclaimed = [w for w in workers if w["state"] in ("interrupted", "lost")]
    print(
        f"trace: {settings.trace} ({settings.slots} slots, "
        f"compressed {settings.compress:g}x, seed {settings.seed}){setup}"
    )
    print(f"capacity offered: {capacity_s:.0f} worker-seconds; progress: {progress} samples")
    steady = ", ".join(f"{count} worker(s) {rate:.0f}" for count, rate in rates.items()) or "none held"
    print(f"steady progress (samples/s, the ideal's rates): {steady}; ideal {ideal:.0f} samples")
    print(
        f"preemptions: {len(reclaimed)} ({sum(w['state'] == 'interrupted' for w in reclaimed)} with notice)"
    )
    print(f"lost work per preemption: {lost_work(samples, reclaimed, sync)}")
    for worker in reclaimed:
        print(f"  worker {worker['id']}: {worker_outcomes(worker)}")
    print(f"notice to replacement: {_replacements(workers)}")
    print(f"zero-worker time: {zero_s:.0f} s")
    epochs = [e["dht_epoch"] for e in samples if e["dht_epoch"] is not None]
    rollbacks = sum(later < earlier for earlier, later in itertools.pairwise(epochs))
    states = sorted({e["state"] for e in samples})
    print(
        f"epoch rollbacks: {rollbacks} (the swarm's epoch in the DHT went back); "
        f"run states: {', '.join(states)}"
    )
    (out / "samples.json").write_text(json.dumps(samples))
    (out / "replay.svg").write_text(svg(samples))
    print(f"plot: {out / 'replay.svg'}")
    print(f"goodput {goodput:.2f} (mode {sync}, slots {settings.slots}, compress {settings.compress:g})")


def lost_work(samples: list[dict[str, Any]], reclaimed: list[dict[str, Any]], sync: str) -> str:
    """Samples a reclaimed worker computed that are not in the model, per preemption. DiLoCo: each
    reclaimed worker's own samples minus those it reported kept (exact, up to its last heartbeat);
    gradients: the run's samples not in a completed or the current epoch, over the preemptions (an
    estimate: it also holds what live workers computed that no epoch took)."""
    if not reclaimed:
        return "no preemption"
    if sync == "diloco":
        lost = [w["samples"] - kept_of(w) for w in reclaimed]
        return f"{statistics.mean(lost):.0f} samples (mean; most {max(lost)}; each worker's own count)"
    total = samples[-1]["samples_total"] - samples[-1]["progress"] - samples[-1]["in_flight"]
    return f"~{total / len(reclaimed):.0f} samples (estimated from the run's totals)"


def worker_outcomes(worker: dict[str, Any]) -> str:
    """A reclaimed worker's end, samples and rounds by outcome: where its lost work came from (in
    DiLoCo, a worker leaves without what it trained since its last round that kept samples: a round
    after it that found no group, or a joiner's first round, which weighs nothing, adds to it)."""
    counts = worker["averaging"] or {}
    outcomes = ", ".join(f"{key} {counts[key]}" for key in AVERAGING_OUTCOMES if counts.get(key))
    kept = f", kept {kept_of(worker)}" if "kept_samples" in counts else ""
    return f"{worker['state']}, {worker['samples']} samples{kept}; rounds: {outcomes or 'none'}"


def _replacements(workers: list[dict[str, Any]]) -> str:
    """Median seconds from a reclaimed worker's end to the next registration after it."""
    registered = sorted(datetime.fromisoformat(w["registered_at"]) for w in workers if w["registered_at"])
    delays = []
    for worker in workers:
        if worker["state"] in ("interrupted", "lost") and worker["ended_at"]:
            ended = datetime.fromisoformat(worker["ended_at"])
            later = [r for r in registered if r > ended]
            if later:
                delays.append((later[0] - ended).total_seconds())
    return f"{statistics.median(delays):.1f} s median of {len(delays)}" if delays else "none measured"


def svg(samples: list[dict[str, Any]], width: int = 640, height: int = 240) -> str:
    """Capacity and running workers (left scale) and progress (scaled to the height) over time."""
    end_s = max(samples[-1]["t_s"], 1.0)
    top = max(max(s["capacity"] for s in samples), max(s["running"] for s in samples), 1)
    most = max(samples[-1]["progress"], 1)

    def line(key: str, scale: float, colour: str) -> str:
        points = " ".join(
            f"{40 + s['t_s'] / end_s * (width - 60):.1f},{height - 30 - s[key] / scale * (height - 50):.1f}"
            for s in samples
        )
        return f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{points}"/>'

    legend = [("capacity", "#888"), ("running workers", "#1f77b4"), ("progress", "#2ca02c")]
    labels = "".join(
        f'<text x="{50 + i * 150}" y="15" fill="{c}" font-size="12">{name}</text>'
        for i, (name, c) in enumerate(legend)
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
        f'<rect width="{width}" height="{height}" fill="white"/>{labels}'
        f"{line('capacity', top, '#888')}{line('running', top, '#1f77b4')}{line('progress', most, '#2ca02c')}"
        f'<text x="40" y="{height - 10}" font-size="11">0 s</text>'
        f'<text x="{width - 60}" y="{height - 10}" font-size="11">{end_s:.0f} s</text></svg>'
    )


if __name__ == "__main__":
    main()
