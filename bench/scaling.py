"""Does N beat 1? Wall time to a validation loss for one worker and N workers, each pinned to its own cores.

A byte-level transformer on the standard library's sources (``bench/bytelm.py``: compute-bound, nothing
downloaded). Arms, each worker a forked process pinned to ``--cpus-per-worker`` cores of its own with
torch's threads set to match:

- A: 1 worker, plain Lightning (no swarm);
- B: 1 worker, HivemindStrategy ``sync="diloco"`` with the strategy's outer step (Nesterov, lr 0.7,
  momentum 0.9, rounds every ``--single-sync-every-s``: the outer step alone can help, so this is
  the fair baseline);
- C: N workers, ``sync="gradients"``; D: N workers, ``sync="local"``; E: N workers, ``sync="diloco"``
  (``--outer-lr`` and ``--outer-momentum``, the strategy's by default);
- F: N workers, ``torch.distributed`` DDP (gloo) on the same cores: the reference;
- G: arm E and H: arm C, each worker behind a link capped at ``--link-mbit`` each way (a network
  namespace per worker, ``bench/slow_link.py``; needs root): what rare averaging keeps when bandwidth
  is scarce, against the same mode on loopback.

Every arm trains for ``--budget-s`` seconds from its first worker's first step; worker 0 evaluates the
validation loss every ``--eval-every-s`` seconds (the same windows for every arm). The target is the best
loss the single arms reach (``--target-loss`` to set it); each arm's time is its first evaluation at or
below it. Arms alternate within each trial, so a machine that gets busier meanwhile hurts all alike;
the table shows medians over trials, T1 = min(A, B), T1/TN, the efficiency T1/(N x TN), E against F, and
for DiLoCo the share of wall time blocked in rounds, G (compute per round / round time) and the
payload of a round (the pseudo-gradient in fp16).

``python bench/scaling.py [--workers 2] [--arms ABCDEF] [--trials 3] [--budget-s 300] [--quick]``
``python bench/scaling.py --arms ABEGCH --link-mbit 100`` (as root) adds the capped links.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.bytelm import add_model_arguments
from bench.forked_peers import become_peer, kill_peers
from bench.slow_link import BRIDGE_IP, capped_links, enter, links_available, worker_ip
from bench.time_to_accuracy import commit, log_tail, machine, run_bootstrap
from worker.protocol.sync import DEFAULT_OUTER_LR, DEFAULT_OUTER_MOMENTUM

ARMS = {
    "A": "1 worker, plain Lightning",
    "B": "1 worker, DiLoCo",
    "C": "N workers, gradients",
    "D": "N workers, local SGD",
    "E": "N workers, DiLoCo",
    "F": "N workers, DDP (gloo)",
    "G": "N workers, DiLoCo, capped links",
    "H": "N workers, gradients, capped links",
}
SINGLE = ("A", "B")
SYNC = {"B": "diloco", "C": "gradients", "D": "local", "E": "diloco", "G": "diloco", "H": "gradients"}
CAPPED = {"G": "E", "H": "C"}  # each capped arm and the loopback arm it is compared with


def pin(cores: list[int]) -> None:
    import torch

    os.sched_setaffinity(0, cores)
    torch.set_num_threads(len(cores))


def record(path: str, entry: dict[str, Any]) -> None:
    with open(path, "a") as out:
        out.write(json.dumps(entry) + "\n")


class Evaluator:
    """Worker 0's validation loss every ``every_s`` seconds, appended to ``path`` (JSON lines)."""

    def __init__(self, model: Any, val: Any, path: str, every_s: float) -> None:
        self.model, self.val, self.path, self.every_s = model, val, path, every_s
        self.next_at = 0.0

    def __call__(self, extra: dict[str, Any]) -> None:
        import torch

        now = time.time()
        if now < self.next_at:
            return
        self.next_at = now + self.every_s
        with torch.no_grad():
            loss = float(self.model.loss(self.val))
        record(self.path, {"at": now, "val_loss": loss, **extra})
        self.next_at = time.time() + self.every_s  # the evaluation's own time is not part of the wait


def data_and_model(args: Any, seed: int) -> tuple[Any, Any, Any]:
    import torch

    from bench.bytelm import ByteTransformer, random_batches, stdlib_bytes, validation_windows

    train, val = stdlib_bytes(args.train_bytes, args.val_bytes)
    torch.manual_seed(0)  # the same initial weights in every worker and arm
    model = ByteTransformer(args.width, args.layers, args.heads, args.context)
    batches = random_batches(train, args.batch_size, args.context, seed)
    return model, batches, validation_windows(val, args.val_windows, args.context)


def lightning_worker(
    arm: str, rank: int, cores: list[int], peers: list[str], run_id: str, path: str, args: Any
) -> None:
    """A worker of arms A-E, G and H (forked): trains until killed; worker 0 evaluates."""
    if arm in CAPPED:
        enter(rank)  # before hivemind starts anything: its DHT and p2pd listen behind the capped link
    become_peer(path + f".{rank}.log")
    pin(cores)
    import torch
    from lightning.pytorch import Callback, LightningModule, Trainer
    from torch.utils.data import DataLoader, IterableDataset

    from worker.protocol.trainer import NO_VALIDATION, QUIET

    model, batches, val = data_and_model(args, seed=rank + 1)

    class Stream(IterableDataset):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            return batches

    class Module(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = model

        def training_step(self, batch: Any, _index: int) -> Any:
            return self.net.loss(batch)

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=args.lr)

    evaluate = Evaluator(model, val, path, args.eval_every_s)

    class Report(Callback):
        def on_train_start(self, trainer: Trainer, module: Any) -> None:
            record(path + ".started", {"at": time.time(), "rank": rank})

        def on_train_batch_end(self, trainer: Trainer, module: Any, *rest: Any) -> None:
            if rank != 0:
                return
            optimizer = getattr(trainer.strategy, "optimizer", None)
            extra = {
                "epoch": int(getattr(optimizer, "local_epoch", 0)),
                "round_s": float(getattr(optimizer, "round_s_total", 0.0)),
                "rounds": int(getattr(optimizer, "rounds", 0)),
            }
            counter = getattr(getattr(optimizer, "outcomes", None), "counter", None)
            if counter is not None:
                extra["averaged"] = int(counter.snapshot().averaged)
            evaluate(extra)

    strategy: Any = "auto"
    if arm in SYNC:
        from worker.strategy import HivemindStrategy

        options: dict[str, Any] = {"sync": SYNC[arm]}
        if SYNC[arm] == "diloco":
            options["sync_every_s"] = args.single_sync_every_s if arm == "B" else args.sync_every_s
        if arm in ("E", "G"):
            options.update(outer_lr=args.outer_lr, outer_momentum=args.outer_momentum)
        if SYNC[arm] == "local":
            options["average_state_every"] = 1  # hivemind's own local SGD: parameters every epoch
        strategy = HivemindStrategy(
            target_batch_size=args.target_batch_size,
            run_id=run_id,
            batch_size=args.batch_size,
            initial_peers=peers,
            host_maddrs=[f"/ip4/{worker_ip(rank) if arm in CAPPED else '127.0.0.1'}/tcp/0"],
            matchmaking_time=args.matchmaking_time,
            averaging_timeout=args.averaging_timeout,
            **options,
        )
    trainer = Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=1,
        max_epochs=-1,
        callbacks=[Report()],
        **QUIET,
        **NO_VALIDATION,
    )
    trainer.fit(Module(), DataLoader(Stream(), batch_size=None))


def ddp_worker(rank: int, world: int, cores: list[int], port: int, path: str, args: Any) -> None:
    """A worker of arm F (forked): plain torch DDP over gloo; worker 0 evaluates."""
    become_peer(path + f".{rank}.log")
    pin(cores)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    model, batches, val = data_and_model(args, seed=rank + 1)
    wrapped = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=args.lr)
    evaluate = Evaluator(model, val, path, args.eval_every_s)
    record(path + ".started", {"at": time.time(), "rank": rank})
    for batch in batches:
        logits = wrapped(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), batch[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0:
            evaluate({})


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_arm(arm: str, workers: int, trial: int, args: Any, workdir: Path) -> list[dict[str, Any]]:
    """Run one arm for ``--budget-s`` of training; worker 0's evaluations, times from the first step."""
    count = 1 if arm in SINGLE else workers
    cores = sorted(os.sched_getaffinity(0))
    per = args.cpus_per_worker
    shares = [cores[i * per : (i + 1) * per] for i in range(count)]
    path = str(workdir / f"{arm}-t{trial}.jsonl")
    context = mp.get_context("fork")  # hivemind cannot be pickled into a spawned process
    procs: list[Any] = []
    try:
        peers: list[str] = []
        if arm in SYNC:
            maddrs = workdir / f"{arm}-t{trial}-bootstrap.json"
            host = BRIDGE_IP if arm in CAPPED else "127.0.0.1"
            boot = context.Process(target=run_bootstrap, args=(str(maddrs), host))
            boot.start()
            procs.append(boot)
            deadline = time.monotonic() + 60
            while not maddrs.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            peers = json.loads(maddrs.read_text())
        port = free_port()
        for rank in range(count):
            if arm == "F":
                target, call = ddp_worker, (rank, count, shares[rank], port, path, args)
            else:
                target, call = (
                    lightning_worker,
                    (arm, rank, shares[rank], peers, f"scale-{arm}-{trial}-{os.getpid()}", path, args),
                )  # type: ignore[assignment]
            proc = context.Process(target=target, args=call)
            proc.start()
            procs.append(proc)
        started = Path(path + ".started")
        deadline = time.monotonic() + args.start_timeout_s
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if not started.exists():
            print(f"arm {arm}: no worker started; worker 0's log ends:\n{log_tail(Path(path + '.0.log'))}")
            return []
        time.sleep(args.budget_s)
        return read_curve(path)
    finally:
        kill_peers(procs)


def read_curve(path: str) -> list[dict[str, Any]]:
    starts = [json.loads(line)["at"] for line in Path(path + ".started").read_text().splitlines()]
    points = [json.loads(line) for line in Path(path).read_text().splitlines()] if Path(path).exists() else []
    return [{**p, "t": p["at"] - min(starts)} for p in points]


def time_to(curve: list[dict[str, Any]], target: float) -> float | None:
    return next((p["t"] for p in curve if p["val_loss"] <= target), None)


def summary(curves: dict[str, list[list[dict[str, Any]]]], args: Any, payload_bytes: int) -> str:
    singles = [p["val_loss"] for arm in SINGLE for curve in curves.get(arm, []) for p in curve]
    target = args.target_loss if args.target_loss is not None else (min(singles) * 1.01 if singles else None)
    if target is None:
        return "no single arm ran: no target"
    times = {}
    for arm, runs in curves.items():
        reached = [t for t in (time_to(curve, target) for curve in runs) if t is not None]
        times[arm] = statistics.median(reached) if len(reached) == len(runs) and reached else None
    t1 = min((times[a] for a in SINGLE if times.get(a) is not None), default=None)
    lines = [
        f"target validation loss {target:.4f} nats/byte",
        "| arm | workers | time to target | T1/T | T1/(N x T) | blocked in rounds | G | rounds averaged |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for arm, runs in curves.items():
        n = 1 if arm in SINGLE else args.workers
        t = times.get(arm)
        speed = f"{t1 / t:.2f}" if t and t1 else "-"
        efficiency = f"{t1 / (n * t):.2f}" if t and t1 else "-"
        blocked, g, averaged = "-", "-", "-"
        last = [curve[-1] for curve in runs if curve]
        if SYNC.get(arm) == "diloco" and last and all(p.get("rounds") for p in last):
            share = statistics.median(p["round_s"] / p["t"] for p in last)
            per_round = statistics.median(p["round_s"] / p["rounds"] for p in last)
            compute = statistics.median((p["t"] - p["round_s"]) / p["rounds"] for p in last)
            blocked, g = f"{share:.1%}", f"{compute / per_round:.1f}"
            if n > 1:  # worker 0's rounds that met another worker
                averaged = f"{statistics.median(p.get('averaged', 0) / p['rounds'] for p in last):.0%}"
        shown = f"{t:.1f} s" if t else "not reached"
        lines.append(
            f"| {arm}: {ARMS[arm]} | {n} | {shown} | {speed} | {efficiency} | {blocked} | {g} | {averaged} |"
        )
    if times.get("E") and times.get("F"):
        lines.append(f"E against F (DDP): {times['F'] / times['E']:.2f}x its speed")
    for capped, loopback in CAPPED.items():
        if times.get(capped) and times.get(loopback):
            lines.append(
                f"{capped} against {loopback}: {times[loopback] / times[capped]:.2f} of its speed over links "
                f"capped at {args.link_mbit:g} Mbit/s"
            )
    lines.append(f"DiLoCo payload per round and worker: {payload_bytes / 1e6:.2f} MB (fp16 pseudo-gradient)")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="N of the N-worker arms")
    parser.add_argument("--arms", default="ABCDEF")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=300.0, help="training time of each arm")
    parser.add_argument("--cpus-per-worker", type=int, default=None, help="default: cores // workers")
    parser.add_argument("--target-loss", type=float, default=None)
    parser.add_argument("--eval-every-s", type=float, default=5.0)
    parser.add_argument(
        "--sync-every-s", type=float, default=5.0, help="some 50-75 steps of this model on a core"
    )
    parser.add_argument(
        "--single-sync-every-s", type=float, default=5.0, help="arm B: its own best round length"
    )
    parser.add_argument("--link-mbit", type=float, default=100.0, help="arms G and H: each link's cap")
    parser.add_argument("--outer-lr", type=float, default=DEFAULT_OUTER_LR, help="arms E and G")
    parser.add_argument("--outer-momentum", type=float, default=DEFAULT_OUTER_MOMENTUM, help="arm E")
    parser.add_argument("--target-batch-size", type=int, default=256, help="arms C and D")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3, help="the best of 1e-3, 3e-3, 5e-3 for one worker")
    add_model_arguments(parser)
    parser.add_argument("--matchmaking-time", type=float, default=1.0)
    parser.add_argument("--averaging-timeout", type=float, default=10.0)
    parser.add_argument("--start-timeout-s", type=float, default=180.0)
    parser.add_argument("--quick", action="store_true", help="a small run that checks the script works")
    return parser


def main() -> int:
    args = build_parser().parse_args()
    if args.quick:
        args.trials, args.budget_s, args.eval_every_s, args.sync_every_s = 1, 8.0, 2.0, 3.0
        args.width, args.layers, args.batch_size, args.val_windows = 32, 1, 16, 16
    cores = len(os.sched_getaffinity(0))
    args.cpus_per_worker = args.cpus_per_worker or max(1, cores // args.workers)
    if args.cpus_per_worker * args.workers > cores:
        print(f"{args.workers} workers x {args.cpus_per_worker} cores do not fit on {cores} cores")
        return 2
    if set(args.arms) & set(CAPPED) and (why := links_available()):
        print(f"arms {', '.join(sorted(set(args.arms) & set(CAPPED)))}: {why}")
        return 2
    from bench.bytelm import ByteTransformer

    model = ByteTransformer(args.width, args.layers, args.heads, args.context)
    payload = 2 * sum(p.numel() for p in model.parameters())
    curves: dict[str, list[list[dict[str, Any]]]] = {arm: [] for arm in args.arms}
    load_before, at_commit = os.getloadavg()[0], commit()  # the code that ran, should HEAD move meanwhile
    capped = set(args.arms) & set(CAPPED)
    links = capped_links(args.workers, args.link_mbit) if capped else contextlib.nullcontext([])
    with tempfile.TemporaryDirectory(prefix="spotswarm-scaling-") as tmp, links:
        for trial in range(args.trials):
            for arm in args.arms:
                curve = run_arm(arm, args.workers, trial, args, Path(tmp))
                best = min((p["val_loss"] for p in curve), default=float("nan"))
                print(
                    f"trial {trial + 1}/{args.trials}, arm {arm}: {len(curve)} evaluations, best {best:.4f}",
                    flush=True,
                )
                curves[arm].append(curve)
    load_after = os.getloadavg()[0]
    print(
        f"\nmachine: {machine()}; load average {load_before:.1f} before, {load_after:.1f} after; "
        f"commit {at_commit}"
    )
    print(
        f"settings: N={args.workers}, {args.cpus_per_worker} core(s) per worker, "
        f"budget {args.budget_s:.0f} s per arm, {args.trials} trial(s), medians; "
        f"model width {args.width}, {args.layers} layer(s), "
        f"context {args.context}, batch {args.batch_size}, AdamW lr {args.lr}; DiLoCo sync_every_s "
        f"{args.sync_every_s} (arm B {args.single_sync_every_s}), "
        f"arm E's outer lr {args.outer_lr} and momentum {args.outer_momentum}"
        + (f"; arms {''.join(sorted(capped))} capped at {args.link_mbit:g} Mbit/s" if capped else "")
    )
    print(summary(curves, args, payload))
    return 0 if all(any(run) for run in curves.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
