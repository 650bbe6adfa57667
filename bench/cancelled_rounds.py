"""Stalls at a swarm's start with hivemind's cancel order and with the strategy's: side by side.

``hivemind.Optimizer`` cancels a pre-scheduled averaging round in each epoch where it counts no other
peer, as in a swarm's first epochs. hivemind 1.1.12 tells the averager before it marks the round
cancelled; on a loaded machine the round can then go on, average stale tensors with the partner and
leave the next round without a group, so the peers wait out ``averaging_timeout``. The strategy marks the
round cancelled first (``cancel_rounds_before_signalling`` in ``worker/strategy/hivemind_fixes.py``).

Each round trains two fresh peers (``bench/time_to_accuracy.py``'s trial: digits, validation accuracy
0.8, averaging timeout 10 s) once with each order, alternating, and the script prints per order how many
trials stalled (took 5 s or more from the first step to the target, against about a second) and the
median time and samples.

``python bench/cancelled_rounds.py [--rounds 6]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import time_to_accuracy as tta

STALL_S = 5.0
ORDERS = ("hivemind", "strategy")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="trials per cancel order (they alternate)")
    args = parser.parse_args()
    settings = tta.build_parser().parse_args(["--target", "0.8", "--timeout-s", "60"])  # its defaults else
    import worker.strategy.optimizer as optimizer  # the peers are forked: they see what is set here

    fixed = optimizer.cancel_rounds_before_signalling
    reached: dict[str, list[tta.Reached | None]] = {order: [] for order in ORDERS}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="spotswarm-cancel-") as tmp:
        for index in range(args.rounds):
            for order in ORDERS:
                optimizer.cancel_rounds_before_signalling = fixed if order == "strategy" else lambda: None
                workdir = Path(tmp) / order  # its own status files
                workdir.mkdir(exist_ok=True)
                result = tta.trial(2, index, settings, workdir)
                text = f"{result.seconds:.1f} s, {result.samples} samples" if result else "not reached"
                print(f"round {index + 1}/{args.rounds}, {order}'s cancel order: {text}", flush=True)
                reached[order].append(result)
    print(
        f"\nmachine: {tta.machine()}; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; "
        f"commit {tta.commit()}"
    )
    print("| cancel order | reached | stalled (>= 5 s) | median time | median samples |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for order, results in reached.items():
        done = [r for r in results if r]
        stalled = sum(r.seconds >= STALL_S for r in done)
        median_s = f"{statistics.median(r.seconds for r in done):.1f} s" if done else "-"
        median_n = f"{statistics.median(r.samples for r in done):.0f}" if done else "-"
        print(f"| {order} | {len(done)}/{len(results)} | {stalled} | {median_s} | {median_n} |")
    return 0 if all(all(results) for results in reached.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
