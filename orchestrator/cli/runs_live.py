"""``spotswarm runs watch|delete``: a run's live table until it ends, and removing a finished run.

Watching polls the API (no connection is held open), so it works through any proxy, and it ends by
itself when the run has ended, with an exit code saying how.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime
from typing import Any

import click

from orchestrator.cli.client import EXIT_ERROR, CliError
from orchestrator.cli.command import ApiContext, api_command
from orchestrator.cli.output import TERMINAL_RUN_STATES, echo_json, echo_table, format_table
from orchestrator.cli.runs import RUN_COLUMNS, run_row
from orchestrator.cli.workers import WORKER_COLUMNS, worker_row


@click.command("watch")
@api_command
@click.argument("name")
@click.option(
    "--interval",
    "interval_s",
    type=click.FloatRange(0.1),
    default=2.0,
    show_default=True,
    help="Seconds between refreshes.",
)
def watch(ctx: ApiContext, name: str, interval_s: float) -> None:
    """Show the run and its workers, refreshed until the run ends; exit 0 when it completed, 1 when it
    failed or was stopped.

    On a terminal the table is redrawn in place; otherwise (a pipe, a CI log) a line is printed whenever
    the run's numbers change (the run's JSON, one object a line, with --json).

    Examples: spotswarm runs watch digits; spotswarm runs watch digits --interval 10 | tee digits.log
    """
    live = sys.stdout.isatty() and not ctx.as_json
    last = ""
    while True:
        run = ctx.api.get_run(name)
        now = datetime.now(UTC)
        if live:
            _redraw(ctx, run, now)
        else:  # a line only when something changed: a log of a day-long run stays readable
            line = one_line_json(run) if ctx.as_json else status_line(run, now)
            if _without_clock(line) != _without_clock(last):
                click.echo(line)
                last = line
        if run["state"] in TERMINAL_RUN_STATES:
            _finish(run)
            return
        time.sleep(interval_s)


def one_line_json(data: dict[str, Any]) -> str:
    return json.dumps(data, default=str)


def _without_clock(line: str) -> str:
    """A refresh line less what changes every time (the time of day, the run's age)."""
    return line[10:].rsplit("  age ", 1)[0] if line and not line.startswith("{") else line


def status_line(run: dict[str, Any], now: datetime) -> str:
    """``12:00:05  state running  workers 2/2  epoch 3  ...  loss 0.33  val_loss 0.55  eta 3s  age 2m``:
    one refresh when there is no terminal; the run's validation metrics come before its eta and age."""
    cells = format_table(RUN_COLUMNS, [run_row(run, now)]).splitlines()[1].split()
    pairs = list(zip(RUN_COLUMNS[1:], cells[1:], strict=True))
    pairs[-2:-2] = [*validation_cells(run), *waiting_cells(run)]
    named = "  ".join(f"{column} {cell}" for column, cell in pairs)
    return f"{now.strftime('%H:%M:%S')}  {named}"


def validation_cells(run: dict[str, Any]) -> list[tuple[str, str]]:
    """The run's reported ``val_*`` metrics, ``val_loss`` first: what shows whether it learns, beside the
    training loss (the rest of its metrics are in ``runs show``)."""
    metrics = (run.get("reported") or {}).get("metrics") or {}
    names = sorted((name for name in metrics if name.startswith("val")), key=lambda n: (n != "val_loss", n))
    return [(name, f"{metrics[name]:.4g}") for name in names]


def waiting_cells(run: dict[str, Any]) -> list[tuple[str, str]]:
    """The share of the workers' time waiting on averaging over the recent window, and G (compute per
    round over the round's cost): whether more workers can pay off. None before workers report them."""
    window = run.get("averaging") or {}
    share, g = window.get("waiting_share"), window.get("g")
    if share is None:
        return []
    return [("waiting", f"{share:.0%}"), ("G", "-" if g is None else f"{g:.3g}")]


def _redraw(ctx: ApiContext, run: dict[str, Any], now: datetime) -> None:
    """The whole screen: the run's row, then its workers (newest first)."""
    click.clear()
    click.echo(f"spotswarm runs watch {run['name']}   {now.strftime('%H:%M:%S')} UTC   (Ctrl-C leaves)\n")
    click.echo(format_table(RUN_COLUMNS, [run_row(run, now)]))
    below = [*validation_cells(run), *waiting_cells(run)]
    if below:
        click.echo("  ".join(f"{name} {value}" for name, value in below))
    click.echo()
    workers = ctx.api.workers(run["name"])["items"]
    echo_table(WORKER_COLUMNS, [worker_row(worker, now) for worker in workers], "(no workers)")


def _finish(run: dict[str, Any]) -> None:
    """Exit 0 for a completed run; otherwise say how it ended on stderr and exit 1."""
    if run["state"] == "completed":
        return
    reason = f": {run['state_reason']}" if run.get("state_reason") else ""
    raise CliError(f"run {run['name']} {run['state']}{reason}", EXIT_ERROR)


@click.command("delete")
@api_command
@click.argument("name")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
def delete(ctx: ApiContext, name: str, yes: bool) -> None:
    """Delete a stopped, completed or failed run with its workers, events and checkpoints.

    Asks first unless --yes; a run still active is refused (exit 6): stop it first.

    Examples: spotswarm runs delete digits; spotswarm runs delete digits --yes
    """
    if not yes and not click.confirm(f"Delete run {name} with its events and checkpoints?", err=True):
        raise CliError("nothing deleted", EXIT_ERROR)
    ctx.api.delete_run(name)
    if ctx.as_json:
        echo_json({"deleted": name})
    else:
        click.echo(f"deleted run {name}")


@click.command("revoke-manual-workers")
@api_command
@click.argument("name")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
def revoke_manual_workers(ctx: ApiContext, name: str, yes: bool) -> None:
    """End every worker of the run joined by hand with its join token: their worker tokens stop working
    at once and running ones are told to stop; launched workers go on. Asks first unless --yes. Replace
    the join token too (runs rotate-join-token), or its holders can join again.

    Example: spotswarm runs revoke-manual-workers digits --yes && spotswarm runs rotate-join-token digits
    """
    if not yes and not click.confirm(f"End every worker of run {name} joined by hand?", err=True):
        raise CliError("nothing revoked", EXIT_ERROR)
    revoked = ctx.api.revoke_manual_workers(name)
    if ctx.as_json:
        echo_json(revoked)
        return
    ids = ", ".join(revoked["revoked"]) or "none"
    click.echo(f"revoked the workers of run {name} joined by hand: {ids}")
