"""The decorator every API-calling command uses: connection flags, ``--json``, and one-line errors.

A command decorated with :func:`api_command` receives an :class:`ApiContext` as its first argument.
Any :class:`~orchestrator.cli.client.CliError` it raises (and Ctrl-C) is turned into one line on stderr
and the error's exit code: never a traceback.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from orchestrator.cli.client import ApiClient, CliError, resolve_connection

F = TypeVar("F", bound=Callable[..., Any])
EXIT_INTERRUPTED = 130


@dataclass
class ApiContext:
    """What a command needs: the client and whether to print JSON."""

    api: ApiClient
    as_json: bool


def fail(message: str, exit_code: int) -> None:
    """Print ``error: <message>`` (one line) on stderr and exit with ``exit_code``."""
    click.echo(f"error: {message}", err=True)
    sys.exit(exit_code)


DEFAULT_TIMEOUT_S = 10.0


def connection_options(func: F) -> F:
    """``--url``, ``--token``, ``--ca-cert``, ``--timeout`` and ``--json``: the one home of their definitions.

    The ``spotswarm`` group and every API command both take them, so they work before the subcommand
    (``spotswarm --json runs list``) and after it; the command's own value wins over the group's.
    """
    options = [
        click.option(
            "--url",
            metavar="URL",
            help="Orchestrator URL. Default: $SPOTSWARM_URL, config 'url', http://127.0.0.1:8000.",
        ),
        click.option(
            "--token", metavar="TOKEN", help="Admin token. Default: $SPOTSWARM_TOKEN, config 'token'."
        ),
        click.option(
            "--ca-cert",
            metavar="PEM",
            help="Trust this certificate (an orchestrator's self-signed one) for https:// URLs. "
            "Default: $SPOTSWARM_CA_CERT, config 'ca_cert', else the usual authorities.",
        ),
        click.option(
            "--timeout",
            "timeout_s",
            type=click.FloatRange(min=0.1),
            help=f"Seconds to wait for each answer.  [default: {DEFAULT_TIMEOUT_S:g}]",
        ),
        click.option(
            "--json", "as_json", is_flag=True, default=None, help="Print the API's JSON (for scripts)."
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _merged(given: dict[str, Any]) -> dict[str, Any]:
    """The connection options of this command, each falling back to the value given before the subcommand."""
    context = click.get_current_context(silent=True)
    before = (context.find_root().obj if context else None) or {}
    merged = {key: value if value is not None else before.get(key) for key, value in given.items()}
    merged["timeout_s"] = merged["timeout_s"] or DEFAULT_TIMEOUT_S
    merged["as_json"] = bool(merged["as_json"])
    return merged


def api_command(func: Callable[..., Any]) -> Callable[..., Any]:
    """Add the :func:`connection_options`; call ``func(ctx, **kw)`` with one-line errors."""

    @connection_options
    @functools.wraps(func)
    def wrapper(
        url: str | None,
        token: str | None,
        ca_cert: str | None,
        timeout_s: float | None,
        as_json: bool | None,
        **params: Any,
    ) -> None:
        options = _merged(
            {"url": url, "token": token, "ca_cert": ca_cert, "timeout_s": timeout_s, "as_json": as_json}
        )
        try:
            connection = resolve_connection(
                options["url"], options["token"], options["timeout_s"], options["ca_cert"]
            )
            with ApiClient(connection) as api:
                func(ApiContext(api, options["as_json"]), **params)
        except CliError as exc:
            fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            fail("interrupted", EXIT_INTERRUPTED)

    return wrapper
