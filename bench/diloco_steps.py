"""How many steps does each worker need? The statistical side of "does N beat 1", free of the machine.

``bench/scaling.py`` measures wall time, so its figures mix two things: what N workers' averaging buys
per step (statistics) and what the rounds cost (systems). This script measures the first alone. It
trains the same byte-level transformer (``bench/bytelm.py``) with N simulated workers in one process,
one after another, and counts steps per worker, so a busy machine slows it but changes no figure:

- ``single``: one worker, AdamW at ``--lr`` (the baseline, T1 in steps);
- ``synchronous``: one worker on N x the batch at the same lr: what perfect synchronous data parallelism
  (DDP) of N workers does per step, the ceiling for any averaging scheme at this lr;
- ``diloco H=h``: N workers, each its own AdamW for h steps, then the mean pseudo-gradient (rounded
  through fp16 as the strategy sends it) and the strategy's own outer step
  (``worker.strategy.diloco.outer.OuterStep``, Nesterov at ``--outer-lr`` and ``--outer-momentum``);
- ``diloco1 H=h``: the same with one worker: the outer step alone (the fair single baseline).

Every arm evaluates the global model on the same validation windows every ``--eval-every`` steps. The
target is the single arms' best loss +1% (or ``--target-loss``); each arm's figure is the first
evaluation at or below it, in steps per worker, and its speed-up in steps over the better single arm.
A wall-time speed-up can only be lower: it adds the rounds' cost (``bench/scaling.py``).

``python bench/diloco_steps.py [--workers 2] [--steps 1500] [--every 50,200] [--lr 3e-3] [--quick]``
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.bytelm import add_model_arguments
from bench.time_to_accuracy import commit, machine

Curve = list[tuple[int, float]]


def train_arm(
    args: argparse.Namespace, workers: int, batch: int, every: int | None, data: object, val: object
) -> Curve:
    """Steps per worker and validation loss; ``every`` None trains without rounds (one worker)."""
    import torch

    from bench.bytelm import ByteTransformer, random_batches
    from worker.strategy.diloco.outer import OuterStep

    torch.manual_seed(args.seed)
    model = ByteTransformer(args.width, args.layers, args.heads, args.context)
    models = [copy.deepcopy(model) for _ in range(workers)]
    streams: list[Iterator[torch.Tensor]] = [
        random_batches(data, batch, args.context, args.seed * 1000 + index)  # type: ignore[arg-type]
        for index in range(workers)
    ]
    inner = [torch.optim.AdamW(m.parameters(), lr=args.lr) for m in models]
    outer = OuterStep(list(model.parameters()), args.outer_lr, args.outer_momentum) if every else None
    curve: Curve = []
    for step in range(1, args.steps + 1):
        for worker, optimizer, stream in zip(models, inner, streams, strict=True):
            optimizer.zero_grad()
            worker.loss(next(stream)).backward()
            optimizer.step()
        if outer is not None and every is not None and step % every == 0:
            per_worker = [outer.pseudo_gradients(list(m.parameters())) for m in models]
            mean = [
                torch.stack([grads[i].half().float() for grads in per_worker]).mean(0)
                for i in range(len(per_worker[0]))
            ]
            outer.apply(mean)
            for worker in models:
                outer.copy_into(list(worker.parameters()))
        if step % args.eval_every == 0:
            with torch.no_grad():
                curve.append((step, float(models[0].loss(val))))  # type: ignore[arg-type]
    return curve


def first_at(curve: Curve, target: float) -> int | None:
    return next((step for step, loss in curve if loss <= target), None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=1500, help="steps per worker of every arm")
    parser.add_argument("--every", default="50,200", help="DiLoCo round lengths in inner steps")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW (the inner optimizer)")
    parser.add_argument("--outer-lr", type=float, default=0.7)
    parser.add_argument("--outer-momentum", type=float, default=0.9)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--eval-every", type=int, default=50)
    add_model_arguments(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target-loss", type=float, default=None, help="default: the best single arm's +1%%")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (figures do not depend on it)")
    parser.add_argument("--quick", action="store_true", help="a tiny run that checks the script works")
    return parser


def main() -> int:
    args = build_parser().parse_args()
    if args.quick:
        args.steps, args.every, args.eval_every = 40, "10", 10
        args.width, args.layers, args.val_windows, args.batch_size = 32, 1, 16, 8
    import torch

    from bench.bytelm import stdlib_bytes, validation_windows

    torch.set_num_threads(args.threads)
    data, val_bytes = stdlib_bytes(args.train_bytes, args.val_bytes)
    val = validation_windows(val_bytes, args.val_windows, args.context)
    n = args.workers
    arms: list[tuple[str, int, int, int | None]] = [("single", 1, args.batch_size, None)]
    arms.append((f"synchronous ({n} x batch)", 1, n * args.batch_size, None))
    for every in (int(part) for part in args.every.split(",")):
        arms += [
            (f"diloco1 H={every}", 1, args.batch_size, every),
            (f"diloco H={every}", n, args.batch_size, every),
        ]
    load_before, at_commit = os.getloadavg()[0], commit()  # the code that ran, should HEAD move meanwhile
    curves: dict[str, Curve] = {}
    for name, workers, batch, round_steps in arms:
        started = time.monotonic()
        curves[name] = train_arm(args, workers, batch, round_steps, data, val)
        print(
            f"arm {name}: best {min(loss for _, loss in curves[name]):.4f}",
            f"({time.monotonic() - started:.0f} s)",
            flush=True,
        )
    single_arms = [name for name, workers, batch, _ in arms if workers == 1 and batch == args.batch_size]
    best_single = min(min(loss for _, loss in curves[name]) for name in single_arms)
    target = args.target_loss or 1.01 * best_single
    how = "given" if args.target_loss else "the best single arm's best +1%"
    reached = [step for name in single_arms if (step := first_at(curves[name], target)) is not None]
    t1 = min(reached, default=None)  # a given target no single arm reached: no speed-ups
    print(
        f"\nmachine: {machine()}; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after;",
        f"commit {at_commit}",
    )
    print(
        f"settings: N={n}, {args.steps} steps per worker, batch {args.batch_size} per worker, "
        f"AdamW lr {args.lr}, "
        f"outer Nesterov lr {args.outer_lr} momentum {args.outer_momentum}, model width {args.width}, "
        f"{args.layers} layer(s), context {args.context}, seed {args.seed}"
    )
    print(
        f"target: {target:.4f} nats/byte ({how}), reached by a single arm at step {t1 or 'none'}\n",
    )
    print("| arm | workers | steps to target | speed-up in steps | best loss |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, workers, _, _ in arms:
        steps = first_at(curves[name], target)
        speedup = f"{t1 / steps:.2f}" if steps and t1 else "-"
        best = min(loss for _, loss in curves[name])
        print(f"| {name} | {workers} | {steps if steps else 'not reached'} | {speedup} | {best:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
