"""``spotswarm serve`` and ``spotswarm db upgrade``.

Every setting of :class:`orchestrator.config.Settings` becomes a flag named as its variable is
(``data_dir``: ``--data-dir``; ``dht.port``: ``--dht-port``) whose help is the field's description plus
its environment variable, so ``spotswarm serve --help`` documents the whole configuration. A flag wins
over the environment, which wins over the default.
Heavy imports (FastAPI, hivemind) happen inside the commands, so ``spotswarm --help`` stays fast.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import click
from pydantic import SecretStr, ValidationError

from orchestrator.config import ENV_PREFIX, Settings, ensure_admin_token

_BOOL, _INT, _FLOAT = "bool", "int", "float"
# Files and directories the server creates (database, checkpoints, uploads, worker logs) are its user's
# only; local workers inherit it.
PRIVATE_UMASK = 0o077


def keep_new_files_private() -> None:
    """Set this process's umask to :data:`PRIVATE_UMASK` (run specs and weights are nobody else's)."""
    os.umask(PRIVATE_UMASK)


def _kind(annotation: Any) -> str:
    types = {a for a in (get_args(annotation) or (annotation,)) if a is not type(None)}
    for python_type, kind in ((bool, _BOOL), (int, _INT), (float, _FLOAT)):
        if python_type in types:
            return kind
    return "str"


def _setting_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``func`` with one click option per setting (default None: env or default wins)."""
    for setting in reversed(Settings.setting_fields()):
        name, field = setting.name, setting.field
        flag = name.replace("_", "-")
        default = field.get_default(call_default_factory=True)
        shown = "generated" if name == "admin_token" else ("unset" if default in (None, []) else default)
        help_text = f"{field.description} [env: {setting.env}; default: {shown}]"
        kind = _kind(field.annotation)
        if kind == _BOOL:
            decl = f"--{flag}/--no-{flag}"
            func = click.option(decl, name, default=None, help=help_text)(func)
        else:
            click_type = {_INT: int, _FLOAT: float}.get(kind, str)
            func = click.option(f"--{flag}", name, type=click_type, default=None, help=help_text)(func)
    return func


def build_settings(options: dict[str, Any]) -> Settings:
    """Settings from the given flags over the environment; exits with a one-line error when invalid."""
    given = {k: v for k, v in options.items() if v is not None}
    if "admin_token" in given:
        given["admin_token"] = SecretStr(given["admin_token"])
    try:
        return Settings(**given)
    except ValidationError as exc:
        problems = "; ".join(f"{Settings.setting_name(e['loc'])}: {e['msg']}" for e in exc.errors())
        raise click.UsageError(f"invalid settings: {problems}") from exc


def announce_admin_token(settings: Settings) -> None:
    """Generate the admin token into the data dir when none is set, and say where it is (only where: the
    token itself must not end up in journald or ``docker logs``). Exits with a one-line error when the
    data dir is not writable."""
    try:
        _, generated = ensure_admin_token(settings)
    except OSError as exc:
        raise click.ClickException(f"cannot write the admin token into {settings.data_dir}: {exc}") from exc
    if generated:
        path = settings.admin_token_path()
        click.echo(f"spotswarm admin token: generated into {path} (read it with: cat {path})")


def stop_stale_dht_peer(settings: Settings) -> None:
    """Stop a DHT peer that a crashed server left on this data dir; a one-line error if its server runs."""
    from orchestrator.swarm.dht_process import StalePeerRunning, stop_stale_peer

    try:
        stop_stale_peer(settings.dht_pid_path())
    except StalePeerRunning as exc:
        raise click.ClickException(str(exc)) from exc


def check_swarm_authority(settings: Settings) -> None:
    """A one-line error when this orchestrator's swarm authority key is not its database's (the app
    checks too, but a failing lifespan prints a traceback). Other failures are left to the app."""
    if not settings.swarm_admission:
        return
    from sqlalchemy.exc import SQLAlchemyError

    from orchestrator.db.session import Database
    from orchestrator.domain.deployment_facts import AuthorityMismatch, claim_authority
    from orchestrator.swarm.admission import load_or_create_key
    from worker.admission.tokens import openssh_public_key

    path = settings.swarm_authority_key_path()
    database = Database(settings.resolved_database_url())
    try:
        database.upgrade()
        claim_authority(database, openssh_public_key(load_or_create_key(path).public_key()), path)
    except AuthorityMismatch as exc:
        raise click.ClickException(str(exc)) from exc
    except (OSError, ValueError, SQLAlchemyError) as exc:  # reported by the app's start, with context
        logging.getLogger(__name__).debug("swarm authority not checked before start: %s", exc)
    finally:
        database.close()


def _configure_logging(settings: Settings, hivemind: bool = True) -> None:
    from worker.runtime.logsetup import configure_logging

    # The server never imports Lightning (the import probe runs in its own process).
    configure_logging(settings.log_level, settings.log_format, hivemind=hivemind, lightning=False)


def check_spot_market(settings: Settings) -> None:
    """Read ``local_spot_market`` before the app starts: a bad file is one line and exit 1, not the
    traceback of a failed start."""
    if settings.local_spot_market is None:
        return
    from orchestrator.launchers.spot_local import load_market_settings
    from orchestrator.launchers.spot_market import SpotMarket, SpotMarketError

    try:
        SpotMarket(load_market_settings(settings.local_spot_market), time.time)
    except SpotMarketError as exc:
        raise click.ClickException(str(exc)) from exc


@click.command()
@_setting_options
def serve(**options: Any) -> None:
    """Run the orchestrator: REST API, DHT peer and background services."""
    import uvicorn

    from orchestrator.app import create_app
    from orchestrator.cli.command import EXIT_INTERRUPTED
    from orchestrator.cli.http_server import (
        raise_open_files_limit,
        taken_port_problem,
        uvicorn_limits,
        warn_if_plain_http,
    )
    from orchestrator.cli.stopping import StoppingServer

    settings = build_settings(options)
    _configure_logging(settings)
    keep_new_files_private()
    announce_admin_token(settings)
    stop_stale_dht_peer(settings)  # the app checks too, but a failing lifespan prints a traceback
    check_swarm_authority(settings)
    check_spot_market(settings)
    if problem := taken_port_problem(settings):
        raise click.ClickException(problem)
    warn_if_plain_http(settings)
    raise_open_files_limit()
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        lifespan="on",
        log_config=None,  # uvicorn's loggers go through ours (same format, JSON included)
        timeout_graceful_shutdown=10,
        access_log=settings.log_level == "debug",
        **uvicorn_limits(settings),
    )
    server = StoppingServer(config, settings.shutdown_grace_s)  # bounded stop: orchestrator/cli/stopping.py
    # Everything imported so far (hivemind brings torch) lives as long as the process: out of the
    # collector's sight, a full collection no longer walks a million objects and stalls every request
    # for a few hundred milliseconds.
    gc.collect()
    gc.freeze()
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it stopped on: exit as a shell expects
        raise SystemExit(EXIT_INTERRUPTED) from None
    if server.interrupted:  # the same, where SIGINT was ignored when the server started
        raise SystemExit(EXIT_INTERRUPTED)
    if not server.started:
        raise SystemExit(1)


@click.group()
def db() -> None:
    """Database maintenance."""


@db.command("upgrade")
@click.option("--database-url", default=None, help=f"SQLAlchemy URL [env: {ENV_PREFIX}DATABASE_URL].")
@click.option(
    "--data-dir", type=click.Path(path_type=Path), default=None, help=f"[env: {ENV_PREFIX}DATA_DIR]"
)
def upgrade(database_url: str | None, data_dir: Path | None) -> None:
    """Apply all migrations (the server also does this at start-up)."""
    from orchestrator.db.session import Database

    settings = build_settings({"database_url": database_url, "data_dir": data_dir})
    _configure_logging(settings, hivemind=False)
    keep_new_files_private()
    database = Database(settings.resolved_database_url())
    try:
        database.upgrade()
    finally:
        database.close()
    click.echo(f"database at head ({database.dialect})")
