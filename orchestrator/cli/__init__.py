"""The ``spotswarm`` command. Server commands live in :mod:`orchestrator.cli.serve` (``serve``,
``db upgrade``); client commands talk to the API over HTTP only and add themselves to :data:`main`."""

from __future__ import annotations

import click

from orchestrator.cli.checkpoints import checkpoints
from orchestrator.cli.demo import demo
from orchestrator.cli.export import export
from orchestrator.cli.peers import peers
from orchestrator.cli.runs import runs
from orchestrator.cli.serve import db, serve
from orchestrator.cli.workers import workers


@click.group()
def main() -> None:
    """spotswarm: elastic Lightning training over hivemind on unreliable machines."""


main.add_command(serve)
main.add_command(db)
main.add_command(demo)
runs.add_command(export)  # its own module: it reads checkpoints with torch
for _client_command in (runs, workers, checkpoints, peers):
    main.add_command(_client_command)
