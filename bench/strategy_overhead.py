"""What HivemindStrategy costs: samples/s of four ways to train the same model on the same data.

Side by side, in one run, same MLP on scikit-learn's digits, same batch size, same Adam:

  (a) plain   plain Lightning, one process, no hivemind
  (b) loop    a hand-written loop over ``hivemind.Optimizer`` (one peer): what hivemind itself costs
  (c) peer1   ``HivemindStrategy``, one peer
  (d) peer2   ``HivemindStrategy``, two peers training together (samples/s summed over both)

It prints samples/s for each and the ratios c/b (the strategy's own overhead; target >= 0.95) and
d/(2c) (how well two peers scale; on a 2-core machine with one thread per peer, each peer has a core
of its own; two peers sharing one GPU can reach at most 0.5). Every variant runs in a fresh
interpreter, one after another (the two peers of (d) at the same time), with ``--threads`` torch
threads each, timed over local steps after ``--warmup`` steps; the sequence is repeated ``--rounds``
times, interleaved, and the median of each variant is reported.

Usage: ``.venv/bin/python bench/strategy_overhead.py [--steps 150] [--hidden 1024] [--batch-size 256]``;
``--accelerator cuda --precision 16-mixed`` runs it on a GPU (``--variants`` picks a subset).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

VARIANTS = ("plain", "loop", "sbloop", "peer1", "peer2")
METRICS = {"samples_per_s": "samples/s", "samples_per_cpu_s": "samples per CPU-second of the process"}


# ------------------------------------------------------------------------------------ workloads
def _model_and_data(args: argparse.Namespace) -> tuple[Any, Any]:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from worker.examples.digits import DigitsModule, load_digits_tensors

    torch.manual_seed(0)
    module = DigitsModule(hidden=args.hidden, depth=args.depth, lr=args.lr)
    features, labels = load_digits_tensors()
    repeats = max(1, (args.steps + args.warmup + 1) * args.batch_size // len(labels) + 1)
    dataset = TensorDataset(features.repeat(repeats, 1), labels.repeat(repeats))
    return module, DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True)


def _device(args: argparse.Namespace) -> Any:
    import torch

    return torch.device("cuda" if args.accelerator == "cuda" else "cpu")


class _StepClock:
    """Times local steps after the warm-up ones, in wall time and in this process's CPU time (all its
    threads: on a machine shared with other work, CPU time per sample still compares variants fairly);
    also remembers losses."""

    def __init__(self, warmup: int, batch_size: int) -> None:
        self.warmup, self.batch_size = warmup, batch_size
        self.steps, self.start, self.end = 0, 0.0, 0.0
        self.cpu_start, self.cpu_end = 0.0, 0.0
        self.losses: list[float] = []

    def tick(self, loss: float) -> None:
        self.steps += 1
        self.losses.append(loss)
        now, cpu = time.perf_counter(), time.process_time()
        if self.steps == self.warmup:
            self.start, self.cpu_start = now, cpu
        self.end, self.cpu_end = now, cpu

    def report(self) -> dict[str, Any]:
        samples = (self.steps - self.warmup) * self.batch_size
        return {
            "samples_per_s": samples / max(self.end - self.start, 1e-9),
            "samples_per_cpu_s": samples / max(self.cpu_end - self.cpu_start, 1e-9),
            "steps": self.steps,
            "first_loss": self.losses[0],
            "last_loss": sum(self.losses[-10:]) / len(self.losses[-10:]),
        }


def _lightning(
    args: argparse.Namespace, strategy: Any | None, callbacks: tuple[Any, ...] = ()
) -> dict[str, Any]:
    from lightning.pytorch import Callback, Trainer

    from worker.protocol.trainer import QUIET

    module, loader = _model_and_data(args)
    clock = _StepClock(args.warmup, args.batch_size)

    class Tick(Callback):
        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, idx: int
        ) -> None:
            clock.tick(float(outputs["loss"]))

    trainer = Trainer(
        accelerator="gpu" if args.accelerator == "cuda" else "cpu",
        devices=1,
        strategy=strategy if strategy is not None else "auto",
        precision=args.precision,
        max_steps=args.steps + args.warmup,
        callbacks=[Tick(), *callbacks],
        **QUIET,
    )
    trainer.fit(module, loader)
    result = clock.report()
    if strategy is not None:
        progress = strategy.swarm_progress()
        result.update(
            swarm_epoch=progress.epoch, peers=progress.num_peers, local_samples=strategy.local_samples
        )
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        result["scaler"] = None if scaler is None else f"{type(scaler).__module__}.{type(scaler).__name__}"
        result["loss_scale"] = None if scaler is None else scaler.get_scale()
    return result


def run_plain(args: argparse.Namespace) -> dict[str, Any]:
    return _lightning(args, strategy=None)


def run_peer(args: argparse.Namespace) -> dict[str, Any]:
    from tests.support.waiting import wait_for_file
    from worker.strategy import HivemindStrategy

    if args.peers_file:
        wait_for_file(Path(args.peers_file), timeout_s=300)
        os.environ["INITIAL_PEERS"] = Path(args.peers_file).read_text().strip()
    strategy = HivemindStrategy(
        target_batch_size=args.target_batch_size,
        run_id="bench",
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        matchmaking_time=1.0,
        averaging_timeout=10.0,
    )
    from lightning.pytorch import Callback

    class StartTogether(Callback):
        """For (d): publish this peer's addresses, say "ready", and start only when both peers are."""

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            if args.publish_peers:
                Path(args.publish_peers).write_text(",".join(strategy.visible_maddrs()))
            if args.barrier:
                Path(args.out).with_suffix(".ready").touch()
                wait_for_file(Path(args.barrier), timeout_s=300)

    return _lightning(args, strategy, callbacks=(StartTogether(),))


def run_loop(args: argparse.Namespace, optimizer_class: Any = None) -> dict[str, Any]:
    """A hand-written loop over hivemind.Optimizer, as hivemind's own examples train (or over the
    strategy's subclass of it, ``optimizer_class``)."""
    import hivemind
    import torch
    import torch.nn.functional as F

    from worker.strategy.dht import start_dht
    from worker.strategy.shutdown import shutdown_optimizer

    optimizer_class = optimizer_class or hivemind.Optimizer
    module, loader = _model_and_data(args)
    device = _device(args)
    model = module.net.to(device)
    dht = start_dht(initial_peers=[], host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    optimizer = optimizer_class(
        dht=dht,
        run_id="bench_loop",
        target_batch_size=args.target_batch_size,
        batch_size_per_step=args.batch_size,
        optimizer=torch.optim.Adam(model.parameters(), lr=args.lr),
        matchmaking_time=1.0,
        averaging_timeout=10.0,
        delay_state_averaging=False,
    )
    clock = _StepClock(args.warmup, args.batch_size)
    for step, (features, labels) in enumerate(loader):
        if step >= args.steps + args.warmup:
            break
        features, labels = features.to(device), labels.to(device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(features), labels)
        loss.backward()
        optimizer.step()
        clock.tick(float(loss))
    result = clock.report()
    result["swarm_epoch"] = optimizer.local_epoch
    shutdown_optimizer(optimizer)
    dht.shutdown()
    return result


def run_strategy_loop(args: argparse.Namespace) -> dict[str, Any]:
    """The hand-written loop over the ``hivemind.Optimizer`` subclass the strategy builds: the strategy
    against it is what Lightning and the strategy's own code cost."""
    from worker.strategy.optimizer import Optimizer

    return run_loop(args, optimizer_class=Optimizer)


# ---------------------------------------------------------------------------------- orchestration
def _child(args: argparse.Namespace, variant: str, out: Path, extra: list[str]) -> subprocess.Popen[bytes]:
    command = [sys.executable, __file__, "--worker", variant, "--out", str(out), *_shared_flags(args), *extra]
    log = open(out.with_suffix(".log"), "wb")  # noqa: SIM115 - closed when the process is reaped
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _shared_flags(args: argparse.Namespace) -> list[str]:
    names = ("steps", "warmup", "hidden", "depth", "batch_size", "target_batch_size", "lr", "threads",
             "accelerator", "precision")  # fmt: skip
    return [str(item) for name in names for item in (f"--{name.replace('_', '-')}", getattr(args, name))]


def _wait(processes: list[subprocess.Popen[bytes]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for process in processes:
        try:
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()


def _read(out: Path) -> dict[str, Any]:
    if not out.exists():
        tail = (
            out.with_suffix(".log").read_text(errors="replace")[-2000:]
            if out.with_suffix(".log").exists()
            else ""
        )
        raise RuntimeError(f"{out.name} produced no result:\n{tail}")
    return json.loads(out.read_text())


def _run_variant(args: argparse.Namespace, variant: str, root: Path) -> dict[str, Any]:
    if variant != "peer2":
        worker = {"plain": "plain", "loop": "loop", "sbloop": "sbloop", "peer1": "peer"}[variant]
        _wait([_child(args, worker, root / f"{variant}.json", [])], args.timeout)
        return _read(root / f"{variant}.json")
    peers, go = root / "peers", root / "go"
    first = _child(args, "peer", root / "peer2_a.json", ["--publish-peers", str(peers), "--barrier", str(go)])
    second = _child(args, "peer", root / "peer2_b.json", ["--peers-file", str(peers), "--barrier", str(go)])
    ready = [root / "peer2_a.ready", root / "peer2_b.ready"]
    deadline = time.monotonic() + args.timeout
    while not all(path.exists() for path in ready) and time.monotonic() < deadline:
        if first.poll() is not None or second.poll() is not None:
            break
        time.sleep(0.1)
    go.touch()  # both peers are set up and joined: both start their timed steps now
    _wait([first, second], args.timeout)
    a, b = _read(root / "peer2_a.json"), _read(root / "peer2_b.json")
    return {
        "samples_per_s": a["samples_per_s"] + b["samples_per_s"],
        "samples_per_cpu_s": a["samples_per_cpu_s"] + b["samples_per_cpu_s"],
        "peers": [a, b],
    }


def orchestrate(args: argparse.Namespace) -> dict[str, Any]:
    """Run every variant ``--rounds`` times, interleaved (machine load drifts), and keep the medians."""
    runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in args.variants}
    with tempfile.TemporaryDirectory(prefix="strategy_bench_") as tmp:
        for round_index in range(args.rounds):
            for variant in args.variants:
                root = (args.work_dir or Path(tmp)) / f"round{round_index}" / variant
                root.mkdir(parents=True, exist_ok=True)
                runs[variant].append(_run_variant(args, variant, root))
                run = runs[variant][-1]
                print(
                    f"round {round_index} {variant:6s} {run['samples_per_s']:10.1f} samples/s "
                    f"{run['samples_per_cpu_s']:10.1f} samples/cpu-s",
                    flush=True,
                )
    results: dict[str, Any] = {}
    for variant, variant_runs in runs.items():
        results[variant] = {"runs": variant_runs}
        for metric in METRICS:
            values = [run[metric] for run in variant_runs]
            results[variant][metric] = sorted(values)[len(values) // 2]
            results[variant][f"{metric}_rounds"] = values
    return results


def summarize(results: dict[str, Any]) -> None:
    for metric, unit in METRICS.items():
        rate = {name: result[metric] for name, result in results.items()}
        print(f"\nmedian {unit}: " + ", ".join(f"{name}={value:.1f}" for name, value in rate.items()))
        if "peer1" in rate and "loop" in rate:
            print(f"  c/b  = strategy / hivemind loop   = {rate['peer1'] / rate['loop']:.3f} (goal >= 0.95)")
        if "peer1" in rate and "sbloop" in rate:
            print(f"  c/b' = strategy / loop over its own optimizer = {rate['peer1'] / rate['sbloop']:.3f}")
        if "peer1" in rate and "plain" in rate:
            print(f"  c/a  = strategy / plain Lightning = {rate['peer1'] / rate['plain']:.3f}")
        if "peer2" in rate and "peer1" in rate:
            print(f"  d/2c = 2 peers / (2 x 1 peer)     = {rate['peer2'] / (2 * rate['peer1']):.3f}")
        for name, result in results.items():
            print(f"  {name:6s} rounds: " + ", ".join(f"{value:.1f}" for value in result[f"{metric}_rounds"]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--steps", type=int, default=120, help="timed local steps per peer")
    parser.add_argument(
        "--short",
        action="store_true",
        help="short steps: a 0.56 M-parameter MLP (512 wide, 3 layers), batch 32, 1500 steps",
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repetitions; medians are reported")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--target-batch-size", type=int, default=8192)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--accelerator", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per variant")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep each variant's result and log here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--peers-file", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--publish-peers", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--barrier", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.short:  # a small model, small batches, one thread: each step is short, so fixed costs show
        args.hidden, args.depth, args.batch_size, args.steps, args.warmup = 512, 3, 32, 1500, 50
    if args.worker is None:
        print(f"strategy overhead: {vars(args)}", flush=True)
        results = orchestrate(args)
        summarize(results)
        if args.json is not None:
            args.json.write_text(json.dumps(results, indent=1, default=str))
        return
    import torch

    torch.set_num_threads(args.threads)
    runner = {"plain": run_plain, "loop": run_loop, "sbloop": run_strategy_loop, "peer": run_peer}[
        args.worker
    ]
    args.out.write_text(json.dumps(runner(args)))


if __name__ == "__main__":
    main()
