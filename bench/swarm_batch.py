"""Samples per swarm epoch: how much work N peers put into each optimizer step, against ``target_batch_size``.

Each trial forks a bootstrap DHT peer (as the orchestrator runs) and N peers that train the digits example
together for ``--seconds``. Every peer reports its contributed samples (``strategy.local_samples``), the swarm
epochs it stepped through and their averaging outcomes. The swarm's batch per epoch is
``sum(samples) / epochs``, printed as a multiple of ``target_batch_size`` (1.0 is the batch asked for).

``python bench/swarm_batch.py --peers 2,4 --trials 2 --seconds 40``
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.forked_peers import become_peer, kill_peers

#: what each variant changes: hivemind's own epoch judgement, or strategy options
#: (the state round every epoch, as hivemind does, where the strategy's default is every 10th)
VARIANTS: dict[str, dict[str, Any]] = {
    "hivemind": {"hivemind_tracker": True, "options": {"average_state_every": 1}},
    "swarm": {"options": {"average_state_every": 1}},
    "state10": {"options": {"average_state_every": 10}},
    "rt": {"options": {"average_state_every": 1, "averager_opts": {"request_timeout": 0.5}}},
    "state10rt": {"options": {"average_state_every": 10, "averager_opts": {"request_timeout": 0.5}}},
}


def run_peer(out: str, initial_peers: list[str], run_id: str, args: argparse.Namespace, tracker: str) -> None:
    """One peer (a forked child, its own process group): trains, then writes its counts to ``out``."""
    become_peer(out + ".log", stdout=False)
    import torch
    from lightning.pytorch import Trainer

    from worker.examples.digits import DigitsDataModule, DigitsModule
    from worker.protocol.trainer import NO_VALIDATION, QUIET
    from worker.strategy import HivemindStrategy

    variant = VARIANTS[tracker]
    if variant.get("hivemind_tracker"):  # the baseline: hivemind's own epoch judgement
        import hivemind

        import worker.strategy.optimizer

        worker.strategy.optimizer.Optimizer = hivemind.Optimizer  # type: ignore[misc]
    torch.set_num_threads(1)
    strategy = HivemindStrategy(
        target_batch_size=args.target_batch_size,
        run_id=run_id,
        initial_peers=initial_peers,
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        matchmaking_time=args.matchmaking_time,
        averaging_timeout=10.0,
        verbose=args.verbose,
        **variant.get("options", {}),
    )
    trainer = Trainer(
        strategy=strategy,
        accelerator="cpu",
        max_epochs=-1,
        max_time={"seconds": args.seconds},
        **QUIET,
        **NO_VALIDATION,
    )
    per_epoch: dict[int, int] = {}
    round_s = [0.0]
    if args.trace:
        trace_epochs(strategy, per_epoch, round_s)
    trainer.fit(DigitsModule(hidden=args.hidden, lr=0.05), DigitsDataModule(batch_size=args.batch_size))
    outcomes = strategy.averaging_outcomes()
    loss = trainer.callback_metrics.get("train_loss")
    result = {
        "loss": None if loss is None else float(loss),
        "samples": strategy.local_samples,
        "epoch": strategy.optimizer.local_epoch,
        "outcomes": outcomes.model_dump() if outcomes is not None else {},
        "per_epoch": per_epoch,
        "round_s": round_s[0],
    }
    Path(out).write_text(json.dumps(result))


def trace_epochs(strategy: Any, per_epoch: dict[int, int], round_s: list[float]) -> None:
    """Log, at each epoch transition, this peer's samples and why the tracker said the epoch is over."""
    import logging

    from hivemind.utils import get_dht_time

    log = logging.getLogger("trace")
    original_setup = strategy.setup_optimizers

    def setup_optimizers(trainer: Any) -> None:
        original_setup(trainer)
        optimizer = strategy.optimizer
        update = optimizer._update_global_epoch

        def traced(grad_scaler: Any) -> None:
            tracker = optimizer.tracker
            g = tracker.global_progress
            local = optimizer.grad_averager.local_samples_accumulated
            why = (
                "behind"
                if g.epoch > tracker.local_progress.epoch
                else "count"
                if g.samples_accumulated >= tracker.target_batch_size
                else "eta"
                if get_dht_time() >= g.eta_next_epoch
                else "?"
            )
            if g.num_peers > 1:
                per_epoch[optimizer.local_epoch] = local
            estimate = getattr(tracker, "estimated_samples", lambda: -1)()
            others = [
                (p.epoch, p.samples, round(p.rate), round(get_dht_time() - p.time, 2))
                for p in getattr(tracker, "_others", ())
            ]
            log.warning(
                "TRACE t=%.2f epoch=%d local=%d est=%d peers=%d why=%s others=%s",
                get_dht_time(),
                optimizer.local_epoch,
                local,
                estimate,
                g.num_peers,
                why,
                others,
            )
            began = time.perf_counter()
            update(grad_scaler)
            round_s[0] += time.perf_counter() - began
            params = [p for group in optimizer.param_groups for p in group["params"]]
            if not all(bool(p.isfinite().all()) for p in params):
                log.warning("TRACE NONFINITE parameters after epoch %d", optimizer.local_epoch)

        optimizer._update_global_epoch = traced

    strategy.setup_optimizers = setup_optimizers


def trial(
    args: argparse.Namespace, peers: int, tracker: str, index: int, workdir: Path
) -> list[dict[str, Any]]:
    import hivemind

    bootstrap = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    initial = [str(addr) for addr in bootstrap.get_visible_maddrs()]
    context = mp.get_context("fork")  # hivemind cannot be pickled into a spawned process
    outs = [workdir / f"{tracker}-n{peers}-t{index}-peer{p}.json" for p in range(peers)]
    run_id = f"batch-{tracker}-{peers}-{index}"
    procs = [
        context.Process(target=run_peer, args=(str(out), initial, run_id, args, tracker)) for out in outs
    ]
    try:
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + args.seconds + 180
        for proc in procs:
            proc.join(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        kill_peers(procs)
        bootstrap.shutdown()
    return [json.loads(out.read_text()) for out in outs if out.exists()]


def summary(results: list[dict[str, Any]], target: int, seconds: float) -> dict[str, Any]:
    samples = sum(r["samples"] for r in results)
    epochs = max((r["epoch"] for r in results), default=0)
    outcome_totals: dict[str, int] = {}
    for r in results:
        for key, value in r["outcomes"].items():
            outcome_totals[key] = outcome_totals.get(key, 0) + int(value)
    counted = sum(v for k, v in outcome_totals.items() if k != "group_size_sum")
    averaged = outcome_totals.get("averaged", 0)
    totals: dict[str, int] = {}
    round_s = [r.get("round_s", 0.0) for r in results]
    for r in results:
        for epoch, local in r.get("per_epoch", {}).items():
            totals[epoch] = totals.get(epoch, 0) + local
    ratios = sorted(round(total / target, 2) for total in totals.values())
    losses = [r["loss"] for r in results if r.get("loss") is not None]
    return {
        "last_loss": round(sum(losses) / len(losses), 3) if losses else None,
        "epoch_ratios": ratios,
        "round_share": round(sum(round_s) / (len(results) * seconds), 3) if results else None,
        "peers_reported": len(results),
        "samples": samples,
        "epochs": epochs,
        "batch_ratio": samples / (epochs * target) if epochs else float("nan"),
        "averaged_fraction": averaged / counted if counted else float("nan"),
        "outcomes": outcome_totals,
    }


def table(lines: list[tuple[str, int, dict[str, Any]]]) -> str:
    """The trials of each variant and swarm size pooled: the batch ratio over all their epochs, the
    spread of single epochs (10th, 50th, 90th percentile), the averaged share and the time in rounds."""
    pooled: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for tracker, peers, result in lines:
        pooled.setdefault((peers, tracker), []).append(result)
    rows = [
        (
            "| peers | variant | trials | swarm epochs | batch ratio | single epochs p10 / p50 / p90 "
            "| averaged | time in rounds |"
        ),
        "| ---: | --- | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    for (peers, tracker), results in sorted(pooled.items()):
        epochs = sum(r["epochs"] for r in results)
        ratio = sum(r["batch_ratio"] * r["epochs"] for r in results) / epochs if epochs else float("nan")
        singles = sorted(x for r in results for x in r["epoch_ratios"])
        spread = (
            " / ".join(f"{singles[int(q * (len(singles) - 1))]:.2f}" for q in (0.1, 0.5, 0.9))
            if singles
            else ""
        )
        averaged = sum(r["outcomes"].get("averaged", 0) for r in results)
        counted = sum(v for r in results for k, v in r["outcomes"].items() if k != "group_size_sum")
        share = sum(r["round_share"] or 0 for r in results) / len(results)
        rows.append(
            f"| {peers} | {tracker} | {len(results)} | {epochs} | {ratio:.2f} | {spread} "
            f"| {averaged / counted if counted else float('nan'):.0%} | {share:.0%} |"
        )
    return "\n".join(rows)


def parse_log(path: Path) -> list[tuple[str, int, dict[str, Any]]]:
    """The per-trial lines of an earlier run's output."""
    lines = []
    for line in path.read_text().splitlines():
        if line.startswith("tracker="):
            head, _, payload = line.partition(" {")
            fields = dict(part.split("=") for part in head.split())
            lines.append((fields["tracker"], int(fields["peers"]), json.loads("{" + payload)))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--peers", default="2,4", help="comma-separated swarm sizes")
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument(
        "--trackers", default="hivemind,swarm", help=f"variants to compare, of: {', '.join(VARIANTS)}"
    )
    parser.add_argument("--seconds", type=int, default=40)
    parser.add_argument("--target-batch-size", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--matchmaking-time", type=float, default=1.0)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--trace", action="store_true", help="log each epoch transition's cause")
    parser.add_argument("--logs", type=Path, help="keep the peers' logs and results in this folder")
    parser.add_argument("--table-from", type=Path, help="print the table of an earlier run's output and exit")
    args = parser.parse_args()
    if args.table_from:
        print(table(parse_log(args.table_from)))
        return
    sizes = [int(p) for p in args.peers.split(",")]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    print(f"commit {commit.strip()}, load {os.getloadavg()[0]:.1f}, {vars(args)}", flush=True)
    lines: list[tuple[str, int, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="spotswarm-batch-") as tmp:
        workdir = args.logs or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for index in range(args.trials):
            for peers in sizes:
                for tracker in args.trackers.split(","):
                    outcome = trial(args, peers, tracker, index, workdir)
                    result = summary(outcome, args.target_batch_size, args.seconds)
                    print(f"tracker={tracker} peers={peers} trial={index} {json.dumps(result)}", flush=True)
                    lines.append((tracker, peers, result))
    print(f"load at the end {os.getloadavg()[0]:.1f}")
    print(table(lines))


if __name__ == "__main__":
    main()
