"""Heartbeat load on a real orchestrator: N simulated workers, one heartbeat every ``--interval-s`` each.

Registers N manual workers with a run's join token (the registration burst: ``--register-concurrency``
joins in flight from the client processes, refusals retried where the server says when; it prints the
registrations/s), then heartbeats as all of them for ``--duration-s`` (after one interval of warm-up)
from ``--processes`` client processes with a bounded pool of keep-alive connections each, and prints
the sustained requests/s, p50/p90/p99/max latency, the error rate, the server's CPU time per heartbeat
and the machine's load average.

    python bench/api_load.py --workers 1000,10000                       # SQLite, own orchestrator
    python bench/api_load.py --workers 10000 --db postgres              # own throwaway PostgreSQL
    python bench/api_load.py --url http://127.0.0.1:8000 --admin-token ssa_... --workers 1000

The orchestrator it starts runs with production time scales (1 s heartbeat flush, 10 s progress
samples, 2 s reconcile ticks): the batch writer and the reconcile loop are part of what is measured.
Its heartbeat timeout (``--heartbeat-timeout-s``, 600 s) outlasts the registration of 10,000 workers
(under a minute to about 2 minutes, with the machine's load): real workers heartbeat from the moment
they register, but these start only once all are registered, and a shorter timeout would have the
first thousands marked lost meanwhile and measure their revival instead of the steady state.
Not a test (it takes minutes); tests/integration/test_api_load_smoke.py runs it with 50 workers.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.load_client import Tally, run_load_process

PRODUCTION_ENV = {  # undo the fast time scales of tests/support/orchestrator.py
    "SPOTSWARM_HEARTBEAT_INTERVAL_S": "5",
    "SPOTSWARM_HEARTBEAT_FLUSH_INTERVAL_S": "1",
    "SPOTSWARM_PROGRESS_SAMPLE_INTERVAL_S": "10",
    "SPOTSWARM_DHT_REFRESH_INTERVAL_S": "5",
    "SPOTSWARM_CHECK_IMPORTS": "false",
    "SPOTSWARM_LOG_LEVEL": "warning",
    "SPOTSWARM_RECONCILE_INTERVAL_S": "2",
}


# Thousands of hand-joined workers register with one join token here: lift its rate limit (for an
# orchestrator given with --url, start it with these, or registrations wait out the 429s' Retry-After).
JOIN_AT_ONCE = {"SPOTSWARM_JOIN_BURST": "100000", "SPOTSWARM_JOIN_RATE_PER_S": "10000"}
# Every simulated worker connects from 127.0.0.1, one client address: no per-address connection cap.
ONE_ADDRESS = {"SPOTSWARM_HTTP_MAX_CONNECTIONS_PER_CLIENT": "0"}


@contextmanager
def own_orchestrator(db: str, reconcile: bool, heartbeat_timeout_s: float) -> Iterator[tuple[str, str, int]]:
    """(url, admin token, server pid) of a fresh `spotswarm serve` on SQLite or a private PostgreSQL."""
    from tests.support.orchestrator import start_orchestrator
    from tests.support.postgres import PostgresCluster
    from tests.support.processes import ProcessRegistry

    with tempfile.TemporaryDirectory(prefix="spotswarm-load-") as tmp:
        registry = ProcessRegistry(Path(tmp))
        cluster = PostgresCluster() if db == "postgres" else None
        try:
            db_url = None
            if cluster is not None:
                cluster.start()
                db_url = cluster.create_database("load")
            env = {
                **PRODUCTION_ENV,
                **JOIN_AT_ONCE,
                **ONE_ADDRESS,
                "SPOTSWARM_RECONCILE": "true" if reconcile else "false",
                "SPOTSWARM_HEARTBEAT_TIMEOUT_S": str(heartbeat_timeout_s),
            }
            orch = start_orchestrator(registry, Path(tmp) / "data", db_url, extra_env=env)
            yield orch.url, orch.admin_token, orch.proc.pid
        finally:
            registry.kill_all()
            if cluster is not None:
                cluster.stop()


# A registration refused for overload (429/503 with Retry-After, or a dropped connection) is tried
# again, as the agent does, until this long has passed since its first try; then it has failed for good.
REGISTER_GIVE_UP_S = 300.0


def register(
    url: str, admin_token: str, count: int, concurrency: int = 64, processes: int = 2
) -> tuple[list[tuple[str, str]], int]:
    """Create a run and join ``count`` manual workers to it from ``processes`` client processes (one
    would be the bottleneck): [(worker id, worker token)] and how many tries were refused on the way
    (and retried)."""
    spec = {
        "name": f"load-{os.getpid()}-{int(time.time())}",
        "module": "worker.examples.digits:DigitsModule",
        "datamodule": "worker.examples.digits:DigitsDataModule",
        "target_batch_size": 1024,
        "batch_size": 32,
        "min_workers": 0,
        "max_workers": 10_000,
        "desired_workers": 0,
    }
    with httpx.Client(base_url=url, timeout=120) as http:
        created = http.post("/api/v1/runs", json=spec, headers={"Authorization": f"Bearer {admin_token}"})
        created.raise_for_status()
    join_token = created.json()["join_token"]
    shares = [list(range(count))[i::processes] for i in range(processes)]
    per_process = max(1, concurrency // processes)
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        jobs = [(url, join_token, share, per_process) for share in shares]
        results = pool.starmap(_register_share, jobs)
    registered = [worker for workers, _ in results for worker in workers]
    retried = [why for _, whys in results for why in whys]
    if retried:
        kinds = ", ".join(f"{kind} x{retried.count(kind)}" for kind in sorted(set(retried)))
        print(f"registration: {len(retried)} tries refused and retried ({kinds})", flush=True)
    return registered, len(retried)


def _register_share(
    url: str, join_token: str, indexes: list[int], concurrency: int
) -> tuple[list[tuple[str, str]], list[str]]:
    """One client process's share of the registrations (see :func:`register`)."""

    async def share() -> tuple[list[tuple[str, str]], list[str]]:
        retried: list[str] = []
        limits = httpx.Limits(max_connections=concurrency)
        join = {"Authorization": f"Bearer {join_token}"}
        gate = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:

            async def one(index: int) -> tuple[str, str]:
                async with gate:
                    return await _register_one(http, join, f"sim-{index}", retried)

            return list(await asyncio.gather(*(one(i) for i in indexes))), retried

    return asyncio.run(share())


async def _register_one(
    http: httpx.AsyncClient, join: dict[str, str], hostname: str, retried: list[str]
) -> tuple[str, str]:
    """One worker's registration, retried where the server says when (Retry-After) or the connection
    dropped, with exponential back-off and jitter, for up to :data:`REGISTER_GIVE_UP_S`."""
    give_up_at = time.monotonic() + REGISTER_GIVE_UP_S
    reply: httpx.Response | None = None
    for attempt in itertools.count():
        told_s = 0.0
        try:
            reply = await http.post("/api/v1/workers/register", json={"hostname": hostname}, headers=join)
        except httpx.TransportError as exc:
            reply, why = None, type(exc).__name__
        else:
            if reply.status_code not in (429, 503):
                break
            why, told_s = str(reply.status_code), float(reply.headers.get("Retry-After", "0"))
        if time.monotonic() >= give_up_at:
            break
        retried.append(why)
        backoff_s = min(10.0, 0.25 * 2**attempt) * random.uniform(0.5, 1.0)
        await asyncio.sleep(max(told_s, backoff_s))
    if reply is None:
        raise RuntimeError(f"{hostname}: no answer from the server after {REGISTER_GIVE_UP_S:.0f} s")
    reply.raise_for_status()
    return reply.json()["worker_id"], reply.json()["worker_token"]


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid`` and its waited-for children (None if unknown)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return sum(int(v) for v in fields[11:15]) / ticks


def measure(
    url: str, workers: list[tuple[str, str]], args: argparse.Namespace, server_pid: int | None
) -> dict[str, Any]:
    """Run the heartbeat phase from ``args.processes`` client processes; the figures."""
    shares = [workers[i :: args.processes] for i in range(args.processes)]
    warmup_s = max(args.interval_s, args.warmup_s)
    load_before, cpu_before = os.getloadavg(), cpu_seconds(server_pid)
    with multiprocessing.get_context("fork").Pool(args.processes) as pool:
        jobs = [
            (url, share, args.interval_s, warmup_s, args.duration_s, args.connections) for share in shares
        ]
        tallies: list[Tally] = pool.starmap(run_load_process, jobs)
    cpu_after = cpu_seconds(server_pid)
    latencies = sorted(t for tally in tallies for t in tally.latencies_s)
    errors = sum(t.errors for t in tallies)
    done = len(latencies)
    answered = sum(t.answered for t in tallies)
    server_cpu = (cpu_after - cpu_before) if cpu_before is not None and cpu_after is not None else None
    return {
        "workers": len(workers),
        "interval_s": args.interval_s,
        "offered_per_s": len(workers) / args.interval_s,
        "p50_ms": 1000 * _quantile(latencies, 0.50),
        "p90_ms": 1000 * _quantile(latencies, 0.90),
        "p99_ms": 1000 * _quantile(latencies, 0.99),
        "max_ms": 1000 * (latencies[-1] if latencies else 0.0),
        "mean_ms": 1000 * (statistics.fmean(latencies) if latencies else 0.0),
        "requests": done + errors,
        "errors": errors,
        "error_rate": errors / max(1, done + errors),
        "first_error": next((t.first_error for t in tallies if t.first_error), ""),
        "server_cpu_ms_per_heartbeat": 1000 * server_cpu / max(1, answered)
        if server_cpu is not None
        else None,
        "throughput_per_s": answered / max(t.busy_s for t in tallies),
        "behind_s": max(0.0, max(t.busy_s for t in tallies) - warmup_s - args.duration_s),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
    }


def _quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def report(figures: dict[str, Any]) -> str:
    cpu = figures["server_cpu_ms_per_heartbeat"]
    return (
        f"{figures['workers']:>6} workers every {figures['interval_s']:g} s: "
        f"offered {figures['offered_per_s']:.0f}/s, served {figures['throughput_per_s']:.0f}/s "
        f"(ended {figures['behind_s']:.1f} s behind), "
        f"p50 {figures['p50_ms']:.1f} ms, p90 {figures['p90_ms']:.1f} ms, p99 {figures['p99_ms']:.1f} ms, "
        f"max {figures['max_ms']:.0f} ms, errors {figures['errors']} ({100 * figures['error_rate']:.2f} %), "
        f"server CPU {'?' if cpu is None else f'{cpu:.2f}'} ms/heartbeat, "
        f"load average {figures['loadavg_before'][0]:.1f} -> {figures['loadavg_after'][0]:.1f}"
        + (f"\n       first error: {figures['first_error']}" if figures["first_error"] else "")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", default="1000,10000", help="comma-separated worker counts")
    parser.add_argument("--interval-s", type=float, default=5.0)
    parser.add_argument("--duration-s", type=float, default=60.0, help="measured window (after warm-up)")
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=15.0,
        help="heartbeats before the measured window (each worker's first heartbeat is its slowest)",
    )
    parser.add_argument(
        "--heartbeat-timeout-s",
        type=float,
        default=600.0,
        help="the own orchestrator's heartbeat timeout: longer than the registration (see above)",
    )
    parser.add_argument("--processes", type=int, default=2, help="client processes")
    parser.add_argument("--connections", type=int, default=32, help="keep-alive connections per process")
    parser.add_argument(
        "--register-concurrency", type=int, default=64, help="registrations in flight at once"
    )
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--no-reconcile", action="store_true", help="own orchestrator without the loop")
    parser.add_argument("--url", help="an orchestrator already running (else one is started per count)")
    parser.add_argument("--admin-token")
    parser.add_argument("--json", type=Path, help="append each result as a JSON line to this file")
    args = parser.parse_args(argv)
    failed = False
    for count in (int(c) for c in args.workers.split(",")):
        if args.url:
            figures = _one(args.url, args.admin_token, None, count, args)
        else:
            with own_orchestrator(args.db, not args.no_reconcile, args.heartbeat_timeout_s) as (
                url,
                token,
                pid,
            ):
                figures = _one(url, token, pid, count, args)
        figures["db"] = "external" if args.url else args.db
        print(report(figures), flush=True)
        if args.json:
            with args.json.open("a") as out:
                out.write(json.dumps(figures) + "\n")
        failed = failed or figures["errors"] > 0
    return 1 if failed else 0


def _one(url: str, token: str, pid: int | None, count: int, args: argparse.Namespace) -> dict[str, Any]:
    started, load_before, cpu_before = time.monotonic(), os.getloadavg(), cpu_seconds(pid)
    workers, refused = register(url, token, count, args.register_concurrency, args.processes)
    took_s, cpu_after = time.monotonic() - started, cpu_seconds(pid)
    cpu_ms = None if cpu_before is None or cpu_after is None else 1000 * (cpu_after - cpu_before) / count
    print(
        f"registered {count} workers in {took_s:.1f} s ({count / took_s:.0f}/s, {refused} tries refused "
        f"and retried, server CPU {'?' if cpu_ms is None else f'{cpu_ms:.2f}'} ms/registration, "
        f"load average {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f})",
        flush=True,
    )
    figures = measure(url, workers, args, pid)
    figures.update(register_s=took_s, register_per_s=count / took_s, register_refused=refused)
    figures["server_cpu_ms_per_registration"] = cpu_ms
    return figures


if __name__ == "__main__":
    sys.exit(main())
