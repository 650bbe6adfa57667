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
from orchestrator.cli.output import TERMINAL_RUN_STATES, echo_json, echo_table, fmt_number, format_table
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
    """``12:00:05  state running  workers 2/2  epoch 3  ...  loss 0.31  val_loss 0.35  eta 5m  age 2m``: one
    refresh when there is no terminal, with the run's validation metrics (``val_*``) beside its loss."""
    cells = format_table(RUN_COLUMNS, [run_row(run, now)]).splitlines()[1].split()
    named = [f"{column} {cell}" for column, cell in zip(RUN_COLUMNS[1:], cells[1:], strict=True)]
    metrics = (run["reported"].get("metrics") or {}).items()
    validation = [f"{name} {fmt_number(value)}" for name, value in sorted(metrics) if name.startswith("val")]
    after_loss = RUN_COLUMNS.index("loss")  # named starts at the second column
    return f"{now.strftime('%H:%M:%S')}  {'  '.join([*named[:after_loss], *validation, *named[after_loss:]])}"


def _redraw(ctx: ApiContext, run: dict[str, Any], now: datetime) -> None:
    """The whole screen: the run's row, then its workers (newest first)."""
    click.clear()
    click.echo(f"spotswarm runs watch {run['name']}   {now.strftime('%H:%M:%S')} UTC   (Ctrl-C leaves)\n")
    click.echo(format_table(RUN_COLUMNS, [run_row(run, now)]))
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
