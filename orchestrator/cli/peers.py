"""``spotswarm peers [NAME]``: the initial peers a hand-started worker or hivemind peer joins with."""

from __future__ import annotations

import click

from orchestrator.cli.command import ApiContext, api_command
from orchestrator.cli.output import echo_json


@click.command("peers")
@api_command
@click.argument("name", required=False)
def peers(ctx: ApiContext, name: str | None) -> None:
    """Print the run's initial peers (without NAME: the orchestrator's own DHT addresses), one a line,
    then an INITIAL_PEERS=... line to paste into a worker's environment.

    Examples: spotswarm peers digits; spotswarm peers
    """
    page = ctx.api.peers(name)
    if ctx.as_json:
        echo_json(page)
        return
    initial = page.get("initial_peers") or []
    orchestrator_peers = set(page.get("orchestrator_peers") or [])
    for maddr in initial:
        click.echo(f"{maddr}  ({'orchestrator' if maddr in orchestrator_peers else 'worker'})")
    if not initial:
        click.echo("(no peers known yet)", err=True)
    click.echo(f"INITIAL_PEERS={','.join(initial)}")
