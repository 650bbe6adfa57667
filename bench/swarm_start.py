"""Stalls at a swarm's start with hivemind's averaging as shipped, with the strategy's, and with the strategy
given a longer chunk timeout: side by side.

Two fresh peers sometimes stall in their first epochs on a loaded machine (the trainer waits out
``averaging_timeout``). Two causes were traced:

- ``hivemind.Optimizer`` cancels a pre-scheduled round in each epoch where it counts no other peer;
  hivemind 1.1.12 tells the averager before it marks the round cancelled, so the round can go on, average
  stale tensors with the partner and leave the next round without a group. The strategy marks the round
  cancelled first (``cancel_rounds_before_signalling`` in ``worker/_hivemind_compat.py``).
- A round waits ``next_chunk_timeout`` (``matchmaking_time`` unless given, 1 s here) for a groupmate's
  tensors, yet a groupmate enters the all-reduce only once its own trainer has the batch: one a second
  late is left out and both average half their tensors. A longer wait saves it, at a cost when the
  groupmate never comes; the third arm gives the strategy a third of ``averaging_timeout``.

Each round trains two fresh peers (``bench/time_to_accuracy.py``'s trial: digits, validation accuracy
0.8, averaging timeout 10 s) once per arm, alternating, and the script prints per arm how many trials
stalled (took 5 s or more from the first step to the target, against about a second) and the median time
and samples.

``python bench/swarm_start.py [--rounds 6]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import time_to_accuracy as tta

STALL_S = 5.0


@dataclass(frozen=True)
class Arm:
    name: str
    strategy_cancel_order: bool
    #: the share of ``averaging_timeout`` given as ``next_chunk_timeout``; None: the strategy's default
    chunk_timeout_share: float | None = None


ARMS = (
    Arm("hivemind", strategy_cancel_order=False),
    Arm("strategy", strategy_cancel_order=True),
    Arm("strategy, chunk timeout 1/3", strategy_cancel_order=True, chunk_timeout_share=1 / 3),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="trials per arm (they alternate)")
    args = parser.parse_args()
    settings = tta.build_parser().parse_args(["--target", "0.8", "--timeout-s", "60"])  # its defaults else
    import worker._hivemind_compat as compat  # install() calls what is set here; the peers are forked

    fixed = compat.cancel_rounds_before_signalling

    def skip() -> None:
        """hivemind's own cancel order: the fix left out."""

    reached: dict[str, list[tta.Reached | None]] = {arm.name: [] for arm in ARMS}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="spotswarm-start-") as tmp:
        for index in range(args.rounds):
            for number, arm in enumerate(ARMS):
                compat.cancel_rounds_before_signalling = (
                    fixed if arm.strategy_cancel_order else skip
                )  # install() calls it
                share = arm.chunk_timeout_share
                settings.next_chunk_timeout = None if share is None else share * settings.averaging_timeout
                workdir = Path(tmp) / f"arm{number}"  # its own status files
                workdir.mkdir(exist_ok=True)
                result = tta.trial(2, index, settings, workdir)
                text = f"{result.seconds:.1f} s, {result.samples} samples" if result else "not reached"
                print(f"round {index + 1}/{args.rounds}, {arm.name}: {text}", flush=True)
                reached[arm.name].append(result)
    print(
        f"\nmachine: {tta.machine()}; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; "
        f"commit {tta.commit()}"
    )
    print("| arm | reached | stalled (>= 5 s) | median time | median samples |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, results in reached.items():
        done = [r for r in results if r]
        stalled = sum(r.seconds >= STALL_S for r in done)
        median_s = f"{statistics.median(r.seconds for r in done):.1f} s" if done else "-"
        median_n = f"{statistics.median(r.samples for r in done):.0f}" if done else "-"
        print(f"| {name} | {len(done)}/{len(results)} | {stalled} | {median_s} | {median_n} |")
    return 0 if all(all(results) for results in reached.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
