"""``spotswarm runs export``: a run's checkpoint as a file plain Lightning and PyTorch load.

The checkpoint is downloaded through the API (SHA-256 checked, as ``checkpoints download`` does), loaded
with ``torch.load(weights_only=True)`` (no code from the file runs here) and rewritten in the export
format of :mod:`worker.protocol.checkpoints`: plain optimizer state, the swarm epoch in a ``spotswarm``
dict. The file appears only when complete (written aside, then renamed).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import click

from orchestrator.cli.checkpoints import pick_checkpoint
from orchestrator.cli.client import EXIT_ERROR, CliError
from orchestrator.cli.command import ApiContext, api_command
from orchestrator.cli.output import echo_json
from orchestrator.sizes import fmt_bytes
from worker.protocol.checkpoints import SPOTSWARM_KEY, exported


@click.command("export")
@api_command
@click.argument("name")
@click.option(
    "--epoch", type=click.IntRange(0), help="The checkpoint of this swarm epoch. Default: the newest."
)
@click.option(
    "-o",
    "--output",
    "output",
    type=click.Path(dir_okay=True, path_type=Path),
    help="File or directory to write to. Default: ./<name>-epoch-<N>-export.ckpt",
)
def export(ctx: ApiContext, name: str, epoch: int | None, output: Path | None) -> None:
    """Export a checkpoint of run NAME for plain Lightning and PyTorch: a file that
    ``YourModule.load_from_checkpoint(path)``, ``torch.load(path, weights_only=True)`` and a plain
    ``Trainer.fit(..., ckpt_path=path)`` take, with the run and its swarm epoch under its ``spotswarm`` key.

    Examples: spotswarm runs export digits; spotswarm runs export digits --epoch 40 -o model.ckpt
    """
    run = ctx.api.get_run(name)
    item = pick_checkpoint(ctx.api.checkpoints(name)["items"], name, epoch)
    default_name = f"{name}-epoch-{item['epoch']}-export.ckpt"
    dest = output or Path(default_name)
    if dest.is_dir():
        dest = dest / default_name
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}.") as scratch:
        downloaded = Path(scratch) / "stored.ckpt"
        sha256 = ctx.api.download(item["download_path"], downloaded, lambda _received, _total: None)
        checkpoint = _load(downloaded, name, item["epoch"])
        spec = run.get("spec") or {}
        result = exported(
            checkpoint,
            run=name,
            checkpoint_epoch=item["epoch"],
            target_batch_size=spec.get("target_batch_size"),
            module=spec.get("module"),
            module_args=spec.get("module_args"),  # left out of a read without the admin token
        )
        written = Path(scratch) / "export.ckpt"
        _save(result, written)
        os.replace(written, dest)
    info = {**result[SPOTSWARM_KEY], "path": str(dest), "size_bytes": dest.stat().st_size, "sha256": sha256}
    if ctx.as_json:
        echo_json(info)
        return
    size = fmt_bytes(info["size_bytes"])
    click.echo(f"exported run {name} at swarm epoch {info['swarm_epoch']} to {dest} ({size})")


def _load(path: Path, name: str, epoch: int) -> dict[str, Any]:
    import pickle

    import torch

    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
        raise CliError(
            f"checkpoint {epoch} of run {name} does not load with torch.load(weights_only=True): {reason}; "
            f"`spotswarm checkpoints download {name} {epoch}` gives the stored file as it is",
            EXIT_ERROR,
        ) from exc
    if not isinstance(checkpoint, dict):
        raise CliError(f"checkpoint {epoch} of run {name} is not a Lightning checkpoint", EXIT_ERROR)
    return checkpoint


def _save(checkpoint: dict[str, Any], path: Path) -> None:
    import torch

    torch.save(checkpoint, path)
