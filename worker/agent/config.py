"""The worker agent's settings (:class:`AgentSettings`), its command line, and its exit-code convention.

Every setting is a flag (``--join-token``) and an environment variable (``SPOTSWARM_JOIN_TOKEN``); a flag
given on the command line wins, an empty variable counts as unset. Launchers set the environment, people
use flags. The flags and ``spotswarm-worker --help`` are made from the fields below, so each description
is the flag's documentation.
"""

from __future__ import annotations

import argparse
import os
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from worker.protocol.comma_list import CommaList

ENV_PREFIX = "SPOTSWARM_"


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/spotswarm``, else ``~/.cache/spotswarm``: shared by the workers of a machine."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "spotswarm"


class AgentSettings(BaseSettings):
    """Everything the agent is told at start-up: each field is ``--<field>`` and ``SPOTSWARM_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_ignore_empty=True, frozen=True)

    url: str = Field(description="Orchestrator URL, e.g. http://10.0.0.5:8000")
    join_token: str = Field(description="The run's join token")
    request_id: str | None = Field(default=None, description="Launch request id, set by launchers")
    worker_dir: Path = Field(
        default=Path("spotswarm-worker"),
        description="Directory for cached peers and registration, temporary checkpoints",
    )
    metadata_url: str | None = Field(
        default=None,
        description="Instance metadata base URL watched for spot interruption notices, e.g. EC2's "
        "http://169.254.169.254 (the ec2 launcher sets it); unset or 'off': no watcher",
    )
    log_level: str = Field(default="INFO", description="DEBUG, INFO, WARNING...")
    log_format: Literal["text", "json"] | None = Field(
        default=None, description="Log lines for people (text, default) or one JSON object a line"
    )
    peers_refresh_s: float = Field(
        default=60.0,
        description="How often the run's peer list is fetched into <worker-dir>/peers.json, the list a "
        "restart uses while the orchestrator is unreachable",
    )
    register_timeout_s: float = Field(
        default=120.0,
        description="Keep trying to register this long while the orchestrator is unreachable",
    )
    stop_grace_s: float = Field(
        default=15.0,
        description="After a stop request, leave at the latest after this many seconds even if a training "
        "step hangs",
    )
    orchestrator_lost_timeout_s: float = Field(
        default=900.0,
        ge=0,
        description="Leave the swarm and exit (code 4) when no heartbeat got an answer for this many "
        "seconds: long enough for an orchestrator restart or reboot, short enough not to pay for machines "
        "that train for nobody; 0 never leaves",
    )
    host_maddrs: CommaList = Field(default_factory=list, description="Comma-separated DHT listen multiaddrs")
    announce_maddrs: CommaList = Field(
        default_factory=list, description="Multiaddrs other peers should dial (public address)"
    )
    accelerator: str = Field(default="auto", description="Lightning accelerator")
    cache_dir: Path = Field(
        default_factory=default_cache_dir,
        description="Where runs' code packages and requirements environments are kept, by digest, for the "
        "next worker of the machine (default: $XDG_CACHE_HOME/spotswarm or ~/.cache/spotswarm)",
    )
    installer: Literal["auto", "uv", "pip"] = Field(
        default="auto", description="What installs a run's requirements: uv when installed (auto), uv, or pip"
    )
    install_timeout_s: float = Field(
        default=900.0, gt=0, description="Time limit of installing a run's requirements"
    )
    cpus: str | None = Field(
        default=None,
        pattern=r"^\d+(,\d+)*$",
        description="CPU list (e.g. 2,3) this worker runs on, torch with as many threads; set by the local "
        "launcher for a run's launcher_options cpus_per_worker; unset: every core",
    )

    @field_validator("worker_dir", "cache_dir")
    @classmethod
    def _absolute(cls, path: Path) -> Path:
        return path.expanduser().resolve()

    @field_validator("log_level")
    @classmethod
    def _upper(cls, level: str) -> str:
        return level.upper()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags over the environment; no ``.env`` file, no secrets directory."""
        return init_settings, env_settings


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    """``spotswarm-worker``'s parser: one option per :class:`AgentSettings` field. Options not given are
    absent from the result (the environment or the default decides)."""
    parser = argparse.ArgumentParser(
        prog="spotswarm-worker",
        description="Join a spotswarm run: register with the orchestrator, train in the swarm, "
        "heartbeat, checkpoint when asked, leave cleanly on SIGTERM or a spot interruption notice.",
        argument_default=argparse.SUPPRESS,
    )
    for name, field in AgentSettings.model_fields.items():
        parser.add_argument(
            _flag(name),
            dest=name,
            choices=_choices(field.annotation),
            help=f"{field.description} [{ENV_PREFIX}{name.upper()}]",
        )
    return parser


def _choices(annotation: object) -> list[str] | None:
    """The values a ``Literal`` field allows (an optional one too), listed in ``--help``."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(candidate) is Literal:
            return [str(value) for value in typing.get_args(candidate)]
    return None


def parse_config(argv: Sequence[str] | None = None) -> AgentSettings:
    """The agent's settings from ``argv`` over the ``SPOTSWARM_*`` environment; exits with code 2
    (:data:`~worker.protocol.exit_codes.EXIT_USAGE`) and one line per problem when something is missing
    or invalid."""
    parser = build_parser()
    flags = vars(parser.parse_args(argv))
    try:
        return AgentSettings(**flags)
    except ValidationError as exc:
        parser.error("; ".join(_problem(error) for error in exc.errors()))


def _problem(error: ErrorDetails) -> str:
    """One validation error in the names a user sets: ``--url (SPOTSWARM_URL) is required``."""
    name = str(error["loc"][0]) if error["loc"] else ""
    where = f"{_flag(name)} ({ENV_PREFIX}{name.upper()})"
    if error["type"] == "missing":
        return f"{where} is required"
    return f"{where}: {error['msg']}"
