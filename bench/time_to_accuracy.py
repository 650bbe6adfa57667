"""Time and samples to a validation target with 1, 2 and 4 peers: whether more peers train one model faster.

Samples per second say how fast peers compute, not whether their work adds up: peers that do not average
train N models, and show up here as more samples (and no less time) to the target. Each configuration
trains the digits example (data shipped with scikit-learn) from the same initial weights until the
swarm's model reaches ``--target`` validation accuracy; the CPU threads are split evenly over the peers.

Each peer is a forked process (its own process group, killed at the end) joined through one bootstrap
DHT peer, as the orchestrator runs. The bootstrap peer is forked too, and each child takes hivemind's
inter-process locks of its own, so a peer killed while holding one blocks no other process; this one
waits for every child with a deadline. Each
peer's output goes to a log file whose end is printed when a configuration misses its target.

After each swarm epoch a peer measures its model's accuracy on the validation split and writes it, with
its samples so far, to a status file. A configuration reaches the target when any of its peers does
(averaged peers hold the same model); its samples are those of all its peers at that moment, its time
counts from the first peer's first step. Configurations alternate trial by trial, so a machine that gets
busier meanwhile hurts all alike; the table shows medians.

``python bench/time_to_accuracy.py [--peers 1,2,4] [--trials 3] [--target 0.93] [--accelerator cpu]``
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.forked_peers import become_peer, kill_peers

HERE = Path(__file__).resolve().parent


@dataclass
class Reached:
    seconds: float
    samples: int


def run_peer(
    status_path: str, initial_peers: list[str], run_id: str, threads: int, peers: int, args: Any
) -> None:
    """One peer (a forked child): trains until the parent kills it, reporting accuracy per swarm epoch."""
    become_peer(status_path + ".log")
    import torch
    from lightning.pytorch import Callback, Trainer

    from worker.examples.digits import DigitsDataModule, DigitsModule
    from worker.protocol.trainer import NO_VALIDATION, QUIET
    from worker.strategy import HivemindStrategy

    torch.set_num_threads(threads)
    torch.manual_seed(0)  # the same initial weights in every peer and configuration
    data = DigitsDataModule(batch_size=args.batch_size)
    data.setup()
    assert data.val_set is not None
    val_x, val_y = data.val_set.tensors

    class Report(Callback):
        def __init__(self) -> None:
            self.epoch = -1
            self.started = 0.0

        def on_train_start(self, trainer: Trainer, module: Any) -> None:
            self.started = time.time()

        def on_train_batch_end(self, trainer: Trainer, module: Any, *rest: Any) -> None:
            strategy: Any = trainer.strategy
            epoch = strategy.optimizer.local_epoch
            if epoch == self.epoch:
                return
            self.epoch = epoch
            with torch.no_grad():
                logits = module(val_x.to(module.device))
                accuracy = float((logits.argmax(dim=1).cpu() == val_y).float().mean())
            status = {
                "started": self.started,
                "at": time.time(),
                "epoch": epoch,
                "accuracy": accuracy,
                "samples": int(strategy.local_samples),
            }
            tmp = status_path + ".tmp"
            Path(tmp).write_text(json.dumps(status))
            os.replace(tmp, status_path)

    strategy = HivemindStrategy(
        target_batch_size=args.target_batch_size,
        run_id=run_id,
        initial_peers=initial_peers,
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        matchmaking_time=args.matchmaking_time,
        averaging_timeout=args.averaging_timeout,
        # a full group starts averaging at once instead of waiting out matchmaking_time
        averager_opts={"target_group_size": peers} if args.full_groups else None,
        **({} if args.next_chunk_timeout is None else {"next_chunk_timeout": args.next_chunk_timeout}),
    )
    trainer = Trainer(
        strategy=strategy,
        accelerator=args.accelerator,
        devices=1,
        max_epochs=-1,
        callbacks=[Report()],
        **QUIET,
        **NO_VALIDATION,
    )
    trainer.fit(DigitsModule(hidden=args.hidden, lr=args.lr), data)


def run_bootstrap(maddrs_path: str, host: str = "127.0.0.1") -> None:
    """The bootstrap DHT peer (a forked child) on ``host``: writes its addresses to ``maddrs_path``, then
    waits."""
    become_peer(maddrs_path + ".log")
    import hivemind

    dht = hivemind.DHT(host_maddrs=[f"/ip4/{host}/tcp/0"], start=True)
    tmp = maddrs_path + ".tmp"
    Path(tmp).write_text(json.dumps([str(addr) for addr in dht.get_visible_maddrs()]))
    os.replace(tmp, maddrs_path)
    while True:
        time.sleep(3600)


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def read(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def trial(peers: int, index: int, args: Any, workdir: Path) -> Reached | None:
    """Train ``peers`` peers until one reaches the target (None: not within ``--timeout-s``, and the end
    of each child's log is printed)."""
    threads = max(1, (os.cpu_count() or 1) // peers)
    context = mp.get_context("fork")  # hivemind cannot be pickled into a spawned process
    maddrs_path = workdir / f"p{peers}-t{index}-bootstrap.json"
    bootstrap = context.Process(target=run_bootstrap, args=(str(maddrs_path),))
    statuses = [workdir / f"p{peers}-t{index}-peer{p}.json" for p in range(peers)]
    run_id = f"tta-{peers}-{index}-{os.getpid()}"
    procs: list[Any] = []
    deadline = time.monotonic() + args.timeout_s
    try:
        bootstrap.start()
        while not maddrs_path.exists():
            if time.monotonic() > deadline or not bootstrap.is_alive():
                print(f"the bootstrap peer did not start:\n{log_tail(Path(str(maddrs_path) + '.log'))}")
                return None
            time.sleep(0.1)
        initial = json.loads(maddrs_path.read_text())
        procs = [
            context.Process(target=run_peer, args=(str(s), initial, run_id, threads, peers, args))
            for s in statuses
        ]
        for proc in procs:
            proc.start()
        while time.monotonic() < deadline:
            seen = [read(s) for s in statuses]
            best = max((s for s in seen if s), key=lambda s: s["accuracy"], default=None)
            if best is not None and best["accuracy"] >= args.target:
                started = min(s["started"] for s in seen if s)
                return Reached(best["at"] - started, sum(s.get("samples", 0) for s in seen))
            if not any(proc.is_alive() for proc in procs):
                break
            time.sleep(0.2)
        for status in statuses:
            print(f"{status.name}: last status {read(status) or 'none'}; its log ends:")
            print(log_tail(Path(str(status) + ".log")))
        return None
    finally:
        kill_peers([*procs, bootstrap])


def commit() -> str:
    try:
        command = ["git", "rev-parse", "--short", "HEAD"]
        out = subprocess.run(command, capture_output=True, text=True, cwd=HERE, check=False)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def machine() -> str:
    model = ""
    try:
        model = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        model = platform.processor()
    return f"{os.cpu_count()} cores ({model or 'unknown CPU'})"


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's options with their defaults (``bench/swarm_start.py`` trains with them too)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--peers", default="1,2,4", help="peer counts, comma-separated (the first: base)")
    parser.add_argument("--trials", type=int, default=3, help="trials per configuration (they alternate)")
    parser.add_argument("--target", type=float, default=0.93, help="validation accuracy to reach")
    parser.add_argument("--target-batch-size", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--matchmaking-time", type=float, default=1.0)
    parser.add_argument("--averaging-timeout", type=float, default=10.0)
    parser.add_argument(
        "--full-groups",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="averager_opts target_group_size = peers: a round starts once every peer joined it",
    )
    parser.add_argument(
        "--next-chunk-timeout",
        type=float,
        default=None,
        help="seconds a round waits on a groupmate's tensors (default: the strategy's)",
    )
    parser.add_argument("--accelerator", default="cpu", help="cpu or cuda (one device per peer process)")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="give up on a trial after this")
    parser.add_argument("--quick", action="store_true", help="1 and 2 peers, 1 trial, target 0.8")
    return parser


def main() -> int:
    args = build_parser().parse_args()
    if args.quick:
        # a quiet 2-core machine reaches 0.8 about 1 s after the first step, some 15 s after the start
        args.peers, args.trials, args.target, args.timeout_s = "1,2", 1, 0.8, 100.0
    counts = [int(p) for p in args.peers.split(",")]
    results: dict[int, list[Reached]] = {n: [] for n in counts}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="spotswarm-tta-") as tmp:
        for index in range(args.trials):
            for peers in counts:
                reached = trial(peers, index, args, Path(tmp))
                text = f"{reached.seconds:.1f} s, {reached.samples} samples" if reached else "not reached"
                print(f"trial {index + 1}/{args.trials}, {peers} peer(s): {text}", flush=True)
                if reached:
                    results[peers].append(reached)
    print(
        f"\nmachine: {machine()}; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; "
        f"commit {commit()}"
    )
    print(
        f"settings: digits MLP hidden {args.hidden}, Adam lr {args.lr}, batch {args.batch_size}, "
        f"target_batch_size {args.target_batch_size}, validation accuracy >= {args.target}, "
        f"target_group_size {'= peers' if args.full_groups else 'unset'}, matchmaking_time "
        f"{args.matchmaking_time} s, {args.accelerator}, CPU threads split evenly over the peers, "
        f"{args.trials} trial(s), medians"
    )
    print("| peers | threads/peer | time to target | samples to target | T(1)/T(N) | samples(N)/samples(1) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    base = results[counts[0]]
    base_t = statistics.median(r.seconds for r in base) if base else None
    base_s = statistics.median(r.samples for r in base) if base else None
    for peers in counts:
        runs = results[peers]
        threads = max(1, (os.cpu_count() or 1) // peers)
        if not runs:
            print(f"| {peers} | {threads} | not reached | - | - | - |")
            continue
        t = statistics.median(r.seconds for r in runs)
        s = statistics.median(r.samples for r in runs)
        speedup = f"{base_t / t:.2f}" if base_t else "-"
        ratio = f"{s / base_s:.2f}" if base_s else "-"
        print(f"| {peers} | {threads} | {t:.1f} s | {s:.0f} | {speedup} | {ratio} |")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
