"""Fuzz the orchestrator's REST API from its own OpenAPI schema (schemathesis cases, driven by hypothesis).

What each answer must hold is written in the harness, tests/support/fuzz.py; the test suite runs it in
miniature (tests/api/test_fuzz.py). Usage::

    python bench/fuzz_api.py --examples 300                  # own orchestrator on SQLite, private reads
    python bench/fuzz_api.py --examples 300 --postgres       # own throwaway PostgreSQL
    python bench/fuzz_api.py --url http://127.0.0.1:8000 --admin-token ssa_... [--public-reads]

Exit code 1 when any operation failed; each failure is printed with a curl command that reproduces it.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.fuzz import Failure, build_world, fuzz, fuzz_orchestrator


def _print_progress(label: str, failure: Failure | None, took_s: float) -> None:
    print(f"{'FAIL' if failure else 'ok  '} {took_s:6.1f} s  {label}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="an orchestrator already running (else one is started)")
    parser.add_argument("--admin-token", help="its admin token (with --url)")
    parser.add_argument("--public-reads", action="store_true", help="the orchestrator serves public reads")
    parser.add_argument("--postgres", action="store_true", help="start the orchestrator on PostgreSQL")
    parser.add_argument("--examples", type=int, default=200, help="generated cases per operation")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    seed_value = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"seed {seed_value} ({args.examples} examples per operation)", flush=True)
    if args.url:
        with httpx.Client(base_url=args.url, timeout=60) as http:
            world = build_world(http, args.admin_token, args.public_reads)
            failures = fuzz(world, args.examples, seed_value, progress=_print_progress)
    else:
        failures = _fuzz_own_orchestrator(args, seed_value)
    for failure in failures:
        print(f"\n=== {failure.operation}\n{failure.message}")
    print(f"\n{len(failures)} operation(s) failed")
    return 1 if failures else 0


def _fuzz_own_orchestrator(args: argparse.Namespace, seed_value: int) -> list[Failure]:
    with (
        tempfile.TemporaryDirectory(prefix="spotswarm-fuzz-") as tmp,
        fuzz_orchestrator(Path(tmp), args.postgres, args.public_reads) as orch,
        orch.client(timeout_s=60) as http,
    ):
        world = build_world(http, orch.admin_token, args.public_reads)
        return fuzz(world, args.examples, seed_value, progress=_print_progress)


if __name__ == "__main__":
    sys.exit(main())
