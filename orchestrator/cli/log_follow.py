"""Following a worker's log (``spotswarm runs logs NAME --worker ID -f``): the tail first, then what the
worker writes, read with the API's ``from_offset`` so nothing is printed twice or skipped; it ends when
the worker has ended."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from orchestrator.cli.client import EXIT_NOT_FOUND, CliError
from orchestrator.cli.command import ApiContext
from orchestrator.domain.states import LIVE_WORKER_STATES, WorkerState

MAX_CHUNK_BYTES = 1024 * 1024  # the API's largest answer for a worker log


def follow_worker_log(ctx: ApiContext, name: str, worker_id: str, tail_bytes: int, interval_s: float) -> None:
    """Print the end of a worker's log, then what it writes, until the worker has ended."""
    offset = _print_chunk(ctx, ctx.api.worker_log(name, worker_id, tail_bytes))
    while True:
        ended = _worker_state(ctx, name, worker_id) not in LIVE_WORKER_STATES
        while True:  # after the state check: nothing the worker wrote before it ended is missed
            chunk = ctx.api.worker_log(name, worker_id, MAX_CHUNK_BYTES, from_offset=offset)
            if chunk["next_offset"] == offset:
                break
            offset = _print_chunk(ctx, chunk)
        if ended:
            return
        time.sleep(interval_s)


def _print_chunk(ctx: ApiContext, chunk: dict[str, Any]) -> int:
    if ctx.as_json:
        click.echo(json.dumps(chunk))
    elif chunk["text"]:
        click.echo(chunk["text"], nl=False)
    return int(chunk["next_offset"])


def _worker_state(ctx: ApiContext, name: str, worker_id: str) -> WorkerState:
    for worker in ctx.api.workers(name)["items"]:
        if str(worker["id"]) == str(worker_id):
            return WorkerState(worker["state"])
    raise CliError(f"404 worker {worker_id} not found in run {name!r}", EXIT_NOT_FOUND)
