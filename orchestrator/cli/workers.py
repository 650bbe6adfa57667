"""``spotswarm workers list NAME``: a run's workers, how far each got and how each ended."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click

from orchestrator.cli.command import ApiContext, api_command
from orchestrator.cli.output import (
    echo_json,
    echo_table,
    fmt_age,
    fmt_metrics,
    fmt_number,
    fmt_usd,
)
from orchestrator.domain.states import LIVE_WORKER_STATES
from worker.protocol.metrics import LOSS_METRIC_NAMES
from worker.protocol.workers import AVERAGING_OUTCOMES

LIVE_STATES = frozenset(state.value for state in LIVE_WORKER_STATES)  # as the API's JSON has them
WORKER_COLUMNS = (
    *("id", "state", "handle", "host", "heartbeat", "samples", "samples/s"),
    *("loss", "averaged", "metrics", "ckpt", "cost", "ended"),
)


@click.group("workers")
def workers() -> None:
    """Inspect the workers of a run."""


#: how much of an end reason a table row shows; ``--wide`` shows all of it
ENDED_CHARS = 60
CUT_MARK = "…"


def _ended(worker: dict[str, Any], max_chars: int | None = ENDED_CHARS) -> str:
    """How a finished worker ended (lost / interrupted / exited / failed) and why: the reason cut to
    ``max_chars`` with :data:`CUT_MARK` (a cut that does not show reads as the whole reason), or whole."""
    if worker["state"] in LIVE_STATES:
        return "retiring" if worker.get("retire_requested_at") else "-"
    why = worker.get("exit_reason") or worker.get("state_reason") or ""
    why = " ".join(why.split()).removeprefix(worker["state"] + ":").strip()
    if max_chars is not None and len(why) > max_chars:
        why = why[: max_chars - 1].rstrip() + CUT_MARK
    return f"{worker['state']}: {why}" if why else worker["state"]


def _averaged(worker: dict[str, Any]) -> str:
    """Its epochs on averaged gradients since it started, e.g. ``92% of 50``."""
    fraction, counts = worker.get("averaged_fraction"), worker.get("averaging") or {}
    if fraction is None:
        return "-"
    epochs = sum(int(counts.get(outcome, 0)) for outcome in AVERAGING_OUTCOMES)  # not sizes or seconds
    return f"{fraction:.0%} of {epochs}"


def worker_row(worker: dict[str, Any], now: datetime, wide: bool = False) -> list[Any]:
    return [
        worker["id"],
        worker["state"],
        worker.get("launcher_handle") or "-",
        worker.get("hostname") or "-",
        fmt_age(worker.get("last_heartbeat_at"), now),
        worker.get("samples", 0),
        fmt_number(worker.get("samples_per_s"), 3),
        fmt_number(worker.get("loss")),
        _averaged(worker),
        fmt_metrics(worker.get("metrics"), skip=LOSS_METRIC_NAMES),
        "yes" if worker.get("checkpointer") else "",
        fmt_usd(worker.get("cost_usd")),
        _ended(worker, None if wide else ENDED_CHARS),
    ]


@workers.command("list")
@api_command
@click.argument("name")
@click.option("--live", is_flag=True, help="Only launching and running workers.")
@click.option(
    "--wide", is_flag=True, help=f"Whole end reasons (the table cuts them at {ENDED_CHARS} characters)."
)
def list_workers(ctx: ApiContext, name: str, live: bool, wide: bool) -> None:
    """List the run's workers, newest first, with how the finished ones ended.

    Examples: spotswarm workers list digits --live; spotswarm workers list digits --wide
    """
    page = ctx.api.workers(name)
    items = [w for w in page["items"] if not live or w["state"] in LIVE_STATES]
    if ctx.as_json:
        echo_json({**page, "items": items})
        return
    now = datetime.now(UTC)
    rows = [worker_row(w, now, wide) for w in items]
    echo_table(WORKER_COLUMNS, rows, "(no workers)")
    if any(str(row[-1]).endswith(CUT_MARK) for row in rows):
        click.echo(f"({CUT_MARK}: reason cut; --wide or --json shows it whole)")
