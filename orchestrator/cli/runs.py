"""``spotswarm runs ...``: create, list, show, scale, stop, resume and follow the events of runs, and
replace a run's join token."""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import yaml

from orchestrator.cli.client import CliError
from orchestrator.cli.command import ApiContext, api_command
from orchestrator.cli.log_follow import follow_worker_log
from orchestrator.cli.output import (
    TERMINAL_RUN_STATES,
    echo_json,
    echo_table,
    fmt_age,
    fmt_duration,
    fmt_number,
    fmt_usd,
    text_chart,
    validation_metric,
)
from orchestrator.cli.run_code import code_of_run, code_options, show_dry_run, upload_code
from orchestrator.domain.averaging import window_text
from orchestrator.sizes import fmt_bytes
from worker.protocol.runs import RunSpec

CHART_WIDTH = 60
RUN_COLUMNS = ("name", "state", "workers", "epoch", "samples/s", "loss", "eta", "age")


def spec_default(field: str) -> str:
    """``  [default: X]`` for a run spec field: the server's default, shown in ``--help``."""
    return f"  [default: {RunSpec.model_fields[field].default}]"


@click.group("runs")
def runs() -> None:
    """Create, inspect and steer training runs."""


# -- create ----------------------------------------------------------------------------------------


def _load_spec_file(path: str) -> dict[str, Any]:
    """A run spec from a YAML or JSON file ('-' for stdin); raises CliError when unreadable."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
        data = yaml.safe_load(text)  # JSON is YAML too
    except OSError as exc:
        raise CliError(f"cannot read spec file {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise CliError(f"spec file {path} is not valid YAML/JSON: {str(exc).splitlines()[0]}") from exc
    if not isinstance(data, dict):
        raise CliError(f"spec file {path} must hold a mapping of run fields")
    return data


def _parse_pairs(pairs: tuple[str, ...], flag: str) -> dict[str, Any]:
    """``KEY=VALUE`` pairs; a VALUE that parses as JSON (numbers, true, lists) is taken as such."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise CliError(f"{flag} expects KEY=VALUE, got {pair!r}", 2)
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


_FLAG_FIELDS = {
    "name": "name",
    "module": "module",
    "datamodule": "datamodule",
    "target_batch_size": "target_batch_size",
    "batch_size": "batch_size",
    "workers": "desired_workers",
    "min_workers": "min_workers",
    "max_workers": "max_workers",
    "checkpoint_every": "checkpoint_every_epochs",
    "keep_checkpoints": "keep_checkpoints",
    "launcher": "launcher",
    "hand_joined_checkpoint": "hand_joined_checkpoint",
    "hand_joined_secrets": "hand_joined_secrets",
}
_PAIR_FIELDS = {
    "module_arg": "module_args",
    "datamodule_arg": "datamodule_args",
    "strategy_option": "strategy_options",
    "launcher_option": "launcher_options",
    "trainer_option": "trainer",
}


def build_spec(file: str | None, flags: dict[str, Any]) -> dict[str, Any]:
    """The run spec to send: the file's fields, overridden by the flags that were given."""
    spec = _load_spec_file(file) if file else {}
    for flag, field in _FLAG_FIELDS.items():
        if flags.get(flag) is not None:
            spec[field] = flags[flag]
    for flag, field in _PAIR_FIELDS.items():
        if flags.get(flag):
            pairs = _parse_pairs(flags[flag], "--" + flag.replace("_", "-"))
            spec[field] = {**(spec.get(field) or {}), **pairs}
    if flags.get("report_metric"):
        spec["report_metrics"] = list(flags["report_metric"])
    stop = dict(spec.get("stop") or {})
    for key in ("target_epochs", "target_samples"):
        if flags.get(key) is not None:
            stop[key] = flags[key]
    if stop:
        spec["stop"] = stop
    return spec


@runs.command("create")
@api_command
@click.option("-f", "--file", "file", metavar="PATH", help="Run spec as YAML or JSON ('-': stdin).")
@click.option("--name", help="Run name: lowercase letters, digits, hyphens.")
@click.option("--module", metavar="PKG.MOD:CLASS", help="LightningModule import path.")
@click.option("--datamodule", metavar="PKG.MOD:CLASS", help="LightningDataModule import path.")
@click.option("--target-batch-size", type=int, help="Samples the swarm accumulates per epoch.")
@click.option("--batch-size", type=int, help="Per-worker batch size.")
@click.option("--workers", type=int, help="Desired worker count." + spec_default("desired_workers"))
@click.option("--min-workers", type=int, help="Fewest workers." + spec_default("min_workers"))
@click.option("--max-workers", type=int, help="Most workers." + spec_default("max_workers"))
@click.option("--target-epochs", type=int, help="Stop after this many swarm epochs.")
@click.option("--target-samples", type=int, help="Stop after this many samples.")
@click.option(
    "--checkpoint-every",
    type=int,
    help="Upload a checkpoint every N epochs." + spec_default("checkpoint_every_epochs"),
)
@click.option(
    "--keep-checkpoints", type=int, help="Checkpoints kept per run." + spec_default("keep_checkpoints")
)
@click.option("--launcher", help="Launcher name (local, ec2, ...)." + spec_default("launcher"))
@click.option("--module-arg", multiple=True, metavar="KEY=VALUE", help="Module keyword (repeatable).")
@click.option("--datamodule-arg", multiple=True, metavar="KEY=VALUE", help="Datamodule keyword (repeatable).")
@click.option("--strategy-option", multiple=True, metavar="KEY=VALUE", help="HivemindStrategy keyword.")
@click.option("--launcher-option", multiple=True, metavar="KEY=VALUE", help="Launcher option.")
@code_options
@click.option(
    "--hand-joined-checkpoint/--no-hand-joined-checkpoint",
    default=None,
    help="Let workers joined by hand with the join token checkpoint the run while no launched worker "
    "can (default: no; a run of hand-joined workers only needs it to keep checkpoints).",
)
@click.option(
    "--hand-joined-secrets/--no-hand-joined-secrets",
    default=None,
    help="Give workers joined by hand the run's secret_env values (default: yes).",
)
@click.option(
    "--trainer-option",
    multiple=True,
    metavar="KEY=VALUE",
    help="Trainer option of every worker (precision=bf16-mixed, gradient_clip_val=1.0, ...; repeatable).",
)
@click.option(
    "--report-metric",
    multiple=True,
    metavar="NAME",
    help="Metric name or glob pattern workers report (repeatable; replaces the default train_loss, val_*).",
)
def create(ctx: ApiContext, file: str | None, **flags: Any) -> None:
    """Create a run from flags and/or a spec file (flags win). Prints the join token once.

    Examples:

    \b
      spotswarm runs create --name digits --module worker.examples.digits:DigitsModule \\
          --datamodule worker.examples.digits:DigitsDataModule --target-batch-size 256 --batch-size 32
      spotswarm runs create -f run.yaml --workers 4 --target-epochs 50 --module-arg hidden=128
    """
    spec = build_spec(file, flags)
    spec_dir = Path(file).parent if file and file != "-" else Path.cwd()

    def say(line: str) -> None:
        click.echo(line, err=ctx.as_json)

    with code_of_run(spec, flags, spec_dir, say) as package:
        directory = flags.get("workdir") or str(spec.get("workdir"))
        if flags["dry_run"]:
            show_dry_run(package, directory, spec, say, ctx.as_json)
            return
        if package is not None:
            spec["workdir"] = upload_code(ctx.api, package, directory, say)
    created = ctx.api.create_run(spec)
    if ctx.as_json:
        echo_json(created)
        return
    click.echo(
        f"created run {created['name']} ({created['state']}), "
        f"{created['spec']['desired_workers']} worker(s) desired"
    )
    click.echo(f"join token (shown only now; manual workers need it): {created.get('join_token', '-')}")


# -- list / show -----------------------------------------------------------------------------------


def run_row(run: dict[str, Any], now: datetime) -> list[Any]:
    workers, reported, swarm = run["workers"], run["reported"], run.get("swarm") or {}
    epoch = max(reported.get("swarm_epoch") or 0, swarm.get("epoch") or 0)
    return [
        run["name"],
        run["state"],
        f"{workers['live']}/{workers['desired']}",
        epoch,
        fmt_number(reported.get("samples_per_s"), 3),
        fmt_number(reported.get("loss")),
        fmt_duration(run.get("eta_s")),
        fmt_age(run.get("created_at"), now).removesuffix(" ago"),
    ]


@runs.command("list")
@api_command
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
def list_runs(ctx: ApiContext, limit: int) -> None:
    """List runs, newest first.

    Example: spotswarm runs list --limit 10
    """
    page = ctx.api.list_runs(limit=limit)
    if ctx.as_json:
        echo_json(page)
        return
    now = datetime.now(UTC)
    rows = [run_row(run, now) for run in page["items"]]
    echo_table(RUN_COLUMNS, rows, "(no runs)")
    if page.get("total", 0) > len(rows):
        click.echo(f"... {page['total'] - len(rows)} more (use --limit)")


MAX_SHOWN_SHARES = 6


def _samples_total(reported: dict[str, Any], workers: list[dict[str, Any]], all_listed: bool) -> str:
    """The run's samples as the sum of its workers' (each one's share shown), from the one read of the
    workers: the run's own total comes from another request, and a worker's count grows by a heartbeat's
    worth at a time (thousands of samples for a fast model). Beyond one page of workers, the run's total."""
    if not all_listed:
        return f"{reported.get('samples_total', 0)} total"
    shares = [int(w.get("samples") or 0) for w in workers if w.get("samples")]
    shown = " + ".join(str(n) for n in shares[:MAX_SHOWN_SHARES])
    if len(shares) > MAX_SHOWN_SHARES:
        shown += " + ..."
    return f"{sum(shares)} total ({shown or 0} from {len(shares)} worker(s), as of their last heartbeats)"


def _show_lines(
    run: dict[str, Any], workers: list[dict[str, Any]], now: datetime, all_listed: bool = True
) -> list[tuple[str, str]]:
    spec, counts, reported = run["spec"], run["workers"], run["reported"]
    swarm = run.get("swarm") or {}
    stop = spec.get("stop") or {}
    targets = [f"{key.removeprefix('target_')} {value}" for key, value in stop.items() if value]
    target = ", ".join(targets) or "none (runs until stopped)"
    ckpt = run.get("latest_checkpoint")
    speed = fmt_number(reported.get("samples_per_s"), 3)
    return [
        ("state", f"{run['state']}" + (f" ({run['state_reason']})" if run.get("state_reason") else "")),
        (
            "workers",
            (
                f"{counts['live']} live / {counts['desired']} desired "
                f"(min {counts['min']}, max {counts['max']}; {counts['launching']} launching)"
            ),
        ),
        ("sync", str(run.get("sync") or "gradients")),
        (
            "rounds" if run.get("sync") == "diloco" else "swarm epoch",
            str(max(reported.get("swarm_epoch") or 0, swarm.get("epoch") or 0)),
        ),
        ("samples", f"{_samples_total(reported, workers, all_listed)}, {speed}/s"),
        ("loss", fmt_number(reported.get("loss"))),
        *[(name, fmt_number(value)) for name, value in (reported.get("metrics") or {}).items()],
        *_averaging_lines(run.get("averaging")),
        ("stop at", target),
        ("eta", fmt_duration(run.get("eta_s"))),
        ("cost so far", fmt_usd(run.get("cost_usd"))),
        ("checkpoint", f"epoch {ckpt['epoch']}, {fmt_bytes(ckpt['size_bytes'])}" if ckpt else "-"),
        ("created", fmt_age(run.get("created_at"), now)),
        ("module", spec["module"]),
        ("datamodule", spec["datamodule"]),
        ("launcher", spec.get("launcher", "-")),
        *_code_lines(spec),
    ]


def _averaging_lines(window: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The averaged fraction over the recent window, and the warning while it is below the threshold."""
    if not window or not window.get("epochs"):
        return [("averaged", "-")]
    fraction, group = window.get("averaged_fraction") or 0.0, window.get("mean_group_size")
    local = {k: n for k, n in window["outcomes"].items() if k != "averaged" and n}
    detail = ", ".join(f"{k} {n}" for k, n in local.items())
    text = f"{fraction:.0%} of {window['epochs']} worker-epochs in the last {window_text(window['window_s'])}"
    text += f", groups of {group:.1f}" if group else ""
    ratio = window.get("batch_ratio")
    text += f", batch {ratio:.2f}x target" if ratio else ""
    text += f" ({detail})" if detail else ""
    lines = [("averaged", text), *_waiting_lines(window)]
    if window.get("warning"):
        lines.append(("WARNING", str(window["warning"])))
    return lines


def _waiting_lines(window: dict[str, Any]) -> list[tuple[str, str]]:
    """The share of the workers' time spent waiting on averaging in the window, and G (compute per round
    over the round's cost), once workers report their seconds."""
    share = window.get("waiting_share")
    if share is None:
        return []
    g = window.get("g")
    ratio = f"G {g:.1f}" if g is not None else "G unbounded (no waiting)"
    return [("waiting", f"{share:.0%} of worker time on averaging, {ratio}")]


def _code_lines(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """The run's package, requirements and environment names (secret values are never sent)."""
    lines = [("workdir", f"package {spec['workdir'][:12]}" if spec.get("workdir") else "-")]
    if spec.get("requirements"):
        lines.append(("requirements", "; ".join(spec["requirements"])))
    names = [*sorted(spec.get("env") or {}), *(f"{n} (secret)" for n in sorted(spec.get("secret_env") or {}))]
    if names:
        lines.append(("env", ", ".join(names)))
    return lines


@runs.command("show")
@api_command
@click.argument("name")
def show(ctx: ApiContext, name: str) -> None:
    """Show a run's state, numbers (its reported metrics too) and text charts of its loss and validation.

    Examples: spotswarm runs show digits; spotswarm runs show digits --json | jq .run.spec
    """
    run = ctx.api.get_run(name)
    progress = ctx.api.progress(name, max_points=CHART_WIDTH * 4)
    page = ctx.api.workers(name)
    workers = page["items"]
    if ctx.as_json:
        echo_json({"run": run, "progress": progress, "workers": workers})
        return
    now = datetime.now(UTC)
    click.echo(f"run {run['name']}")
    for key, value in _show_lines(run, workers, now, len(workers) >= page.get("total", 0)):
        click.echo(f"  {key:<12} {value}")
    points = progress.get("points", [])
    stored = progress.get("stored_points", len(points))
    _echo_chart("loss", [(p["at"], p.get("loss")) for p in points], stored, now)
    validation = validation_metric({name for p in points for name in p.get("metrics") or {}})
    if validation:
        series = [(p["at"], (p.get("metrics") or {}).get(validation)) for p in points]
        _echo_chart(validation, series, stored, now)


def _echo_chart(title: str, series: list[tuple[str, float | None]], stored: int, now: datetime) -> None:
    """A text chart of the points of ``series`` (time, value) that have a value."""
    known = [(at, value) for at, value in series if value is not None]
    click.echo(f"\n{title} ({len(known)} points of {stored} stored):")
    click.echo(text_chart([value for _, value in known], width=CHART_WIDTH))
    if known:
        click.echo(f"  from {fmt_age(known[0][0], now)} to {fmt_age(known[-1][0], now)}")


# -- scale / stop / resume -------------------------------------------------------------------------


def _echo_counts(ctx: ApiContext, run: dict[str, Any], verb: str) -> None:
    if ctx.as_json:
        echo_json(run)
        return
    counts = run["workers"]
    click.echo(
        f"run {run['name']} {verb}: {run['state']}, {counts['live']} live / "
        f"{counts['desired']} desired (min {counts['min']}, max {counts['max']})"
    )


@runs.command("scale")
@api_command
@click.argument("name")
@click.argument("desired", type=click.IntRange(0))
@click.option("--min", "min_workers", type=click.IntRange(0), help="Also change the minimum.")
@click.option("--max", "max_workers", type=click.IntRange(1), help="Also change the maximum.")
def scale(ctx: ApiContext, name: str, desired: int, min_workers: int | None, max_workers: int | None) -> None:
    """Set the run's desired worker count (the orchestrator launches or retires workers).

    Example: spotswarm runs scale digits 6 --min 2 --max 8
    """
    body: dict[str, Any] = {"desired_workers": desired}
    if min_workers is not None:
        body["min_workers"] = min_workers
    if max_workers is not None:
        body["max_workers"] = max_workers
    _echo_counts(ctx, ctx.api.scale_run(name, body), "scaled")


@runs.command("stop")
@api_command
@click.argument("name")
@click.option("--reason", help="Recorded in the run's events.")
def stop(ctx: ApiContext, name: str, reason: str | None) -> None:
    """Stop a run: its workers are told to leave; checkpoints are kept.

    Example: spotswarm runs stop digits --reason "enough for today"
    """
    _echo_counts(ctx, ctx.api.stop_run(name, reason), "stopping")


@runs.command("resume")
@api_command
@click.argument("name")
@click.option("--target-epochs", type=click.IntRange(1), help="New stop condition: this many swarm epochs.")
@click.option("--target-samples", type=click.IntRange(1), help="New stop condition: this many samples.")
def resume(ctx: ApiContext, name: str, target_epochs: int | None, target_samples: int | None) -> None:
    """Resume a stopped, failed or completed run from its latest checkpoint.

    A completed run needs a stop condition it has not reached yet: give a higher target (either target
    flag replaces the run's whole stop condition).

    Example: spotswarm runs resume digits --target-epochs 100
    """
    stop = None
    if target_epochs is not None or target_samples is not None:
        stop = {"target_epochs": target_epochs, "target_samples": target_samples}
    _echo_counts(ctx, ctx.api.resume_run(name, stop), "resumed")


@runs.command("rotate-join-token")
@api_command
@click.argument("name")
def rotate_join_token(ctx: ApiContext, name: str) -> None:
    """Replace the run's join token: the old one stops working at once; running workers keep going."""
    rotated = ctx.api.rotate_join_token(name)
    if ctx.as_json:
        echo_json(rotated)
        return
    click.echo(f"new join token of run {name} (shown only now; the old one no longer works):")
    click.echo(rotated["join_token"])


# -- logs ------------------------------------------------------------------------------------------


def _echo_event(ctx: ApiContext, event: dict[str, Any]) -> None:
    if ctx.as_json:
        click.echo(json.dumps(event, default=str))  # one JSON object per line, for streaming
        return
    worker = f" [worker {event['worker_id']}]" if event.get("worker_id") else ""
    click.echo(f"{event['at']}  {event['kind']:<20}{worker} {event['message']}")


@runs.command("logs")
@api_command
@click.argument("name")
@click.option(
    "-f",
    "--follow",
    is_flag=True,
    help="Keep printing until the run ends (with --worker: until the worker ends).",
)
@click.option(
    "--interval",
    "interval_s",
    type=click.FloatRange(0.1),
    default=1.0,
    show_default=True,
    help="Seconds between polls with --follow.",
)
@click.option("--after-id", type=click.IntRange(0), default=0, help="Only events newer than this id.")
@click.option("--worker", "worker_id", default=None, help="Print this worker's log tail instead of events.")
@click.option(
    "--tail-bytes",
    type=click.IntRange(1, 1024 * 1024),
    default=64 * 1024,
    show_default=True,
    help="With --worker: at most this many bytes from the end of its log.",
)
def logs(
    ctx: ApiContext,
    name: str,
    follow: bool,
    interval_s: float,
    after_id: int,
    worker_id: str | None,
    tail_bytes: int,
) -> None:
    """Print the run's event log (JSON lines with --json). With --follow, exit once the run has ended.

    With --worker ID, print the end of that worker's own log (stdout and stderr) instead; with --follow
    too, keep printing what it writes until the worker has ended.

    Examples:

    \b
      spotswarm runs logs digits -f
      spotswarm workers list digits          # find the worker id
      spotswarm runs logs digits --worker 7 -f
    """
    if worker_id is not None and follow:
        follow_worker_log(ctx, name, worker_id, tail_bytes, interval_s)
        return
    if worker_id is not None:
        tail = ctx.api.worker_log(name, worker_id, tail_bytes)
        if ctx.as_json:
            echo_json(tail)
        else:
            click.echo(tail["text"], nl=not tail["text"].endswith("\n"))
        return
    cursor = _print_events(ctx, name, after_id)
    while follow:
        ended = ctx.api.get_run(name)["state"] in TERMINAL_RUN_STATES
        cursor = _print_events(ctx, name, cursor)  # after the state check: no final event is missed
        if ended:
            return
        time.sleep(interval_s)


def _print_events(ctx: ApiContext, name: str, after_id: int) -> int:
    """Print every event newer than ``after_id`` (all pages) and return the new cursor."""
    cursor = after_id
    while True:
        page = ctx.api.events(name, after_id=cursor)
        for event in page["items"]:
            _echo_event(ctx, event)
        cursor = max(cursor, int(page.get("next_after_id", cursor)))
        if not page["items"]:
            return cursor
