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


def api_command(func: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--url``, ``--token``, ``--ca-cert``, ``--timeout`` and ``--json``; call ``func(ctx, **kw)``."""

    @click.option(
        "--url",
        metavar="URL",
        help="Orchestrator URL. Default: $SPOTSWARM_URL, config 'url', http://127.0.0.1:8000.",
    )
    @click.option("--token", metavar="TOKEN", help="Admin token. Default: $SPOTSWARM_TOKEN, config 'token'.")
    @click.option(
        "--ca-cert",
        metavar="PEM",
        help="Trust this certificate (an orchestrator's self-signed one) for https:// URLs. "
        "Default: $SPOTSWARM_CA_CERT, config 'ca_cert', else the usual authorities.",
    )
    @click.option(
        "--timeout",
        "timeout_s",
        type=float,
        default=10.0,
        show_default=True,
        help="Seconds to wait for each answer.",
    )
    @click.option("--json", "as_json", is_flag=True, help="Print the API's JSON (for scripts).")
    @functools.wraps(func)
    def wrapper(
        url: str | None,
        token: str | None,
        ca_cert: str | None,
        timeout_s: float,
        as_json: bool,
        **params: Any,
    ) -> None:
        try:
            connection = resolve_connection(url, token, timeout_s, ca_cert)
            with ApiClient(connection) as api:
                func(ApiContext(api, as_json), **params)
        except CliError as exc:
            fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            fail("interrupted", EXIT_INTERRUPTED)

    return wrapper
