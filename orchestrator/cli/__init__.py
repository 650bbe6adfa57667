"""The ``spotswarm`` command: :data:`main` and its subcommands.

- Server commands: ``serve.py`` (``serve``, ``db upgrade``), ``demo.py`` (``demo``); around the server:
  ``http_server.py`` (checks and limits before it starts), ``stopping.py`` (a bounded stop).
- Client commands, which talk to the API over HTTP only: ``runs.py`` and ``runs_live.py`` (``runs ...``),
  ``workers.py``, ``checkpoints.py``, ``peers.py``, ``export.py`` (``runs export``: reads checkpoints
  with torch), ``log_follow.py`` (``runs logs -f``), ``run_code.py`` and ``packaging.py`` (a run's code
  from ``--workdir``, packed and uploaded once).
- Shared: ``command.py`` (connection flags, ``--json``, one-line errors), ``client.py`` (the HTTP
  client, where its URL and token come from), ``output.py`` (tables, JSON, charts).
"""

from __future__ import annotations

from typing import Any

import click

from orchestrator.cli.checkpoints import checkpoints
from orchestrator.cli.command import connection_options
from orchestrator.cli.demo import demo
from orchestrator.cli.export import export
from orchestrator.cli.peers import peers
from orchestrator.cli.runs import runs
from orchestrator.cli.runs_live import delete, revoke_manual_workers, watch
from orchestrator.cli.serve import db, serve
from orchestrator.cli.workers import workers


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="spotswarm", message="spotswarm %(version)s")
@connection_options
@click.pass_context
def main(ctx: click.Context, **connection: Any) -> None:
    """spotswarm: elastic Lightning training over hivemind on unreliable machines.

    The connection options (--url, --token, --ca-cert, --timeout, --json) go before or after the
    subcommand. Examples:

    \b
      spotswarm --url http://10.0.0.5:8000 --token ssa_... runs list
      spotswarm runs show digits --json
    """
    ctx.obj = connection


runs.add_command(watch)
runs.add_command(delete)
runs.add_command(revoke_manual_workers)
main.add_command(serve)
main.add_command(db)
main.add_command(demo)
runs.add_command(export)  # its own module: it reads checkpoints with torch
for _client_command in (runs, workers, checkpoints, peers):
    main.add_command(_client_command)
