"""The worker agent's command line and environment, and its exit-code convention.

Every flag has an environment variable (``SPOTSWARM_<NAME>``); a flag given on the command line wins.
Launchers set the environment, people use flags.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Exit codes, read by launchers (orchestrator/launchers/local_files.py: PERMANENT_EXIT_CODES).
EXIT_OK = 0  # stopped, completed, interrupted: left the run cleanly
EXIT_FAILED = 1  # training crashed or the orchestrator stayed unreachable: worth another worker
EXIT_USAGE = 2  # bad command line (argparse's own code)
EXIT_CONFIG = 3  # permanent: bad join token, user module does not import, unusable run spec
EXIT_ORCHESTRATOR_LOST = 4  # no answer from the orchestrator for --orchestrator-lost-timeout-s: left


@dataclass(frozen=True)
class AgentConfig:
    """Everything the agent is told at start-up."""

    url: str
    join_token: str
    worker_dir: Path
    request_id: str | None = None
    metadata_url: str | None = None
    log_level: str = "INFO"
    log_format: str | None = None  # text or json; None: SPOTSWARM_LOG_FORMAT, else text
    peers_refresh_s: float = 60.0
    register_timeout_s: float = 120.0
    stop_grace_s: float = 15.0
    orchestrator_lost_timeout_s: float = 900.0  # 0: keep training without an orchestrator for ever
    host_maddrs: list[str] = field(default_factory=list)
    announce_maddrs: list[str] = field(default_factory=list)
    accelerator: str = "auto"
    cache_dir: Path = field(default_factory=lambda: default_cache_dir({}))
    installer: str = "auto"
    install_timeout_s: float = 900.0


def default_cache_dir(environ: Mapping[str, str]) -> Path:
    """``$XDG_CACHE_HOME/spotswarm``, else ``~/.cache/spotswarm``: shared by the workers of a machine."""
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "spotswarm"


def _split(value: str | None) -> list[str]:
    return [item.strip() for item in (value or "").split(",") if item.strip()]


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    """The parser; each default comes from the matching ``SPOTSWARM_*`` variable of ``environ``."""

    def env(name: str, default: str | None = None) -> str | None:
        return environ.get(f"SPOTSWARM_{name}") or default

    parser = argparse.ArgumentParser(
        prog="spotswarm-worker",
        description="Join a spotswarm run: register with the orchestrator, train in the swarm, "
        "heartbeat, checkpoint when asked, leave cleanly on SIGTERM or a spot interruption notice.",
    )
    add = parser.add_argument
    add("--url", default=env("URL"), help="Orchestrator URL, e.g. http://10.0.0.5:8000 [SPOTSWARM_URL]")
    add("--join-token", default=env("JOIN_TOKEN"), help="The run's join token [SPOTSWARM_JOIN_TOKEN]")
    add(
        "--request-id",
        default=env("REQUEST_ID"),
        help="Launch request id, set by launchers [SPOTSWARM_REQUEST_ID]",
    )
    add(
        "--worker-dir",
        default=env("WORKER_DIR", "spotswarm-worker"),
        help="Directory for cached peers and registration, temporary checkpoints [SPOTSWARM_WORKER_DIR]",
    )
    add(
        "--metadata-url",
        default=env("METADATA_URL"),
        help="Instance metadata base URL watched for spot interruption notices, e.g. EC2's "
        "http://169.254.169.254 (the ec2 launcher sets it); unset or 'off': no watcher "
        "[SPOTSWARM_METADATA_URL]",
    )
    add("--log-level", default=env("LOG_LEVEL", "INFO"), help="DEBUG, INFO, WARNING... [SPOTSWARM_LOG_LEVEL]")
    add(
        "--log-format",
        choices=("text", "json"),
        default=env("LOG_FORMAT"),
        help="Log lines for people (text, default) or one JSON object a line [SPOTSWARM_LOG_FORMAT]",
    )
    add(
        "--peers-refresh-s",
        type=float,
        default=float(env("PEERS_REFRESH_S", "60") or 60),
        help="How often the run's peer list is fetched into <worker-dir>/peers.json, the list a restart "
        "uses while the orchestrator is unreachable [SPOTSWARM_PEERS_REFRESH_S]",
    )
    add(
        "--register-timeout-s",
        type=float,
        default=float(env("REGISTER_TIMEOUT_S", "120") or 120),
        help="Keep trying to register this long while the orchestrator is unreachable "
        "[SPOTSWARM_REGISTER_TIMEOUT_S]",
    )
    add(
        "--stop-grace-s",
        type=float,
        default=float(env("STOP_GRACE_S", "15") or 15),
        help="After a stop request, leave at the latest after this many seconds even if a training "
        "step hangs [SPOTSWARM_STOP_GRACE_S]",
    )
    add(
        "--orchestrator-lost-timeout-s",
        type=float,
        default=float(env("ORCHESTRATOR_LOST_TIMEOUT_S", "900") or 900),
        help="Leave the swarm and exit (code 4) when no heartbeat got an answer for this many seconds: "
        "long enough for an orchestrator restart or reboot, short enough not to pay for machines that "
        "train for nobody; 0 never leaves [SPOTSWARM_ORCHESTRATOR_LOST_TIMEOUT_S]",
    )
    add(
        "--host-maddrs",
        default=env("HOST_MADDRS"),
        help="Comma-separated DHT listen multiaddrs [SPOTSWARM_HOST_MADDRS]",
    )
    add(
        "--announce-maddrs",
        default=env("ANNOUNCE_MADDRS"),
        help="Multiaddrs other peers should dial (public address) [SPOTSWARM_ANNOUNCE_MADDRS]",
    )
    add(
        "--accelerator",
        default=env("ACCELERATOR", "auto"),
        help="Lightning accelerator [SPOTSWARM_ACCELERATOR]",
    )
    add(
        "--cache-dir",
        default=env("CACHE_DIR") or str(default_cache_dir(environ)),
        help="Where runs' code packages and requirements environments are kept, by digest, for the next "
        "worker of the machine (default: $XDG_CACHE_HOME/spotswarm or ~/.cache/spotswarm) "
        "[SPOTSWARM_CACHE_DIR]",
    )
    add(
        "--installer",
        choices=("auto", "uv", "pip"),
        default=env("INSTALLER", "auto"),
        help="What installs a run's requirements: uv when installed (auto), uv, or pip [SPOTSWARM_INSTALLER]",
    )
    add(
        "--install-timeout-s",
        type=float,
        default=float(env("INSTALL_TIMEOUT_S", "900") or 900),
        help="Time limit of installing a run's requirements [SPOTSWARM_INSTALL_TIMEOUT_S]",
    )
    return parser


def parse_config(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> AgentConfig:
    """Build the config from ``argv`` and ``environ``; exits with code 2 (usage) when something is missing."""
    environ = os.environ if environ is None else environ
    parser = build_parser(environ)
    args = parser.parse_args(argv)
    if not args.url:
        parser.error("the orchestrator URL is required (--url or SPOTSWARM_URL)")
    if not args.join_token:
        parser.error("the run's join token is required (--join-token or SPOTSWARM_JOIN_TOKEN)")
    if args.orchestrator_lost_timeout_s < 0:
        parser.error("--orchestrator-lost-timeout-s must be 0 (never) or more")
    if args.install_timeout_s <= 0:
        parser.error("--install-timeout-s must be more than 0")
    return AgentConfig(
        url=args.url,
        join_token=args.join_token,
        worker_dir=Path(args.worker_dir).expanduser().resolve(),
        request_id=args.request_id,
        metadata_url=args.metadata_url,
        log_level=args.log_level.upper(),
        log_format=args.log_format,
        peers_refresh_s=args.peers_refresh_s,
        register_timeout_s=args.register_timeout_s,
        stop_grace_s=args.stop_grace_s,
        orchestrator_lost_timeout_s=args.orchestrator_lost_timeout_s,
        host_maddrs=_split(args.host_maddrs),
        announce_maddrs=_split(args.announce_maddrs),
        accelerator=args.accelerator,
        cache_dir=Path(args.cache_dir).expanduser().resolve(),
        installer=args.installer,
        install_timeout_s=args.install_timeout_s,
    )
