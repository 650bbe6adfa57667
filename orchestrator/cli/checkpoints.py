"""``spotswarm checkpoints list|download|delete``: a run's stored checkpoints."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import click

from orchestrator.cli.client import EXIT_ERROR, EXIT_NOT_FOUND, EXIT_USAGE, CliError
from orchestrator.cli.command import ApiContext, api_command
from orchestrator.cli.output import echo_json, echo_table
from orchestrator.sizes import fmt_bytes


@click.group("checkpoints")
def checkpoints() -> None:
    """List, download and delete a run's checkpoints."""


@checkpoints.command("list")
@api_command
@click.argument("name")
def list_checkpoints(ctx: ApiContext, name: str) -> None:
    """List the run's checkpoints, newest epoch first.

    Example: spotswarm checkpoints list digits
    """
    page = ctx.api.checkpoints(name)
    if ctx.as_json:
        echo_json(page)
        return
    rows = [
        [c["epoch"], fmt_bytes(c["size_bytes"]), c["created_at"], c["sha256"][:12], c["download_path"]]
        for c in page["items"]
    ]
    echo_table(["epoch", "size", "created", "sha256", "download"], rows, "(no checkpoints)")


def pick_checkpoint(items: list[dict[str, Any]], name: str, epoch: int | None) -> dict[str, Any]:
    """The checkpoint of ``epoch`` among a run's ``items`` (the newest when None); CliError if none."""
    if not items:
        raise CliError(f"run {name} has no checkpoints yet", EXIT_NOT_FOUND)
    if epoch is None:
        return max(items, key=lambda c: c["epoch"])
    for item in items:
        if item["epoch"] == epoch:
            return item
    have = ", ".join(str(c["epoch"]) for c in items)
    raise CliError(f"run {name} has no checkpoint of epoch {epoch} (have: {have})", EXIT_NOT_FOUND)


@checkpoints.command("download")
@api_command
@click.argument("name")
@click.argument("epoch", type=click.IntRange(0), required=False)
@click.option(
    "-o",
    "--output",
    "output",
    type=click.Path(dir_okay=True, path_type=Path),
    help="File or directory to write to. Default: ./<name>-epoch-<N>.ckpt",
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
def download(ctx: ApiContext, name: str, epoch: int | None, output: Path | None, quiet: bool) -> None:
    """Download a checkpoint (the latest when EPOCH is left out), verified by SHA-256.

    Examples: spotswarm checkpoints download digits; spotswarm checkpoints download digits 20 -o d20.ckpt
    """
    item = pick_checkpoint(ctx.api.checkpoints(name)["items"], name, epoch)
    default_name = f"{name}-epoch-{item['epoch']}.ckpt"
    dest = output or Path(default_name)
    if dest.is_dir():
        dest = dest / default_name
    show_bar = not quiet and not ctx.as_json and sys.stderr.isatty()
    bar = click.progressbar(
        length=item["size_bytes"],
        label=f"epoch {item['epoch']}",
        file=sys.stderr,
        show_pos=False,
        show_percent=True,
    )
    done = [0]

    def on_bytes(received: int, total: int | None) -> None:  # noqa: ARG001 - the download callback's signature
        if show_bar:
            bar.update(received - done[0])
        done[0] = received

    with bar if show_bar else contextlib.nullcontext():
        sha256 = ctx.api.download(item["download_path"], dest, on_bytes)
    result = {"path": str(dest), "epoch": item["epoch"], "size_bytes": done[0], "sha256": sha256}
    if ctx.as_json:
        echo_json(result)
    else:
        click.echo(f"saved epoch {item['epoch']} to {dest} ({fmt_bytes(done[0])}, sha256 {sha256[:12]}…)")


@checkpoints.command("delete")
@api_command
@click.argument("name")
@click.argument("epoch", type=click.IntRange(0), required=False)
@click.option(
    "--uploaded-by",
    type=click.IntRange(0),
    metavar="WORKER_ID",
    help="Delete every one this worker uploaded.",
)
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
def delete(ctx: ApiContext, name: str, epoch: int | None, uploaded_by: int | None, yes: bool) -> None:
    """Delete the run's checkpoint of EPOCH, or every one a worker uploaded (--uploaded-by): one that
    does not load (a checkpoint.unloadable event names it and its uploader), or that you no longer trust.
    Workers that start later resume from the newest one left. Asks first unless --yes.

    Examples: spotswarm checkpoints delete digits 20; spotswarm checkpoints delete digits --uploaded-by 7
    """
    if (epoch is None) == (uploaded_by is None):
        raise CliError("give either EPOCH or --uploaded-by WORKER_ID", EXIT_USAGE)
    what = (
        f"the checkpoint of epoch {epoch}"
        if epoch is not None
        else f"every checkpoint worker {uploaded_by} uploaded"
    )
    if not yes and not click.confirm(f"Delete {what} of run {name}?", err=True):
        raise CliError("nothing deleted", EXIT_ERROR)
    deleted = ctx.api.delete_checkpoints(name, epoch=epoch, uploaded_by=uploaded_by)
    if ctx.as_json:
        echo_json(deleted)
        return
    epochs = ", ".join(str(c["epoch"]) for c in deleted["items"])
    click.echo(f"deleted checkpoints of run {name}: epochs {epochs}")
