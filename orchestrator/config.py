"""The orchestrator's one settings object, read from ``SPOTSWARM_*`` environment variables or CLI flags.

Build it once (``Settings()`` or ``Settings(port=..., ...)``) and pass it to
:func:`orchestrator.app.create_app`; nothing reads settings from a global. ``spotswarm serve --help`` is
generated from the field descriptions below, so each description is the flag's documentation.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from orchestrator import files

logger = logging.getLogger(__name__)

ENV_PREFIX = "SPOTSWARM_"
ADMIN_TOKEN_PREFIX = "ssa_"
MaddrList = Annotated[list[str], NoDecode]


class Settings(BaseSettings):
    """Everything `spotswarm serve` can be told; each field is ``SPOTSWARM_<FIELD>`` and ``--<field>``."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, validate_default=True)

    host: str = Field(default="127.0.0.1", description="Address the HTTP API binds to (0.0.0.0 for all).")
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port of the HTTP API.")
    tls_proxy: bool = Field(
        default=False,
        description="A TLS-terminating reverse proxy is in front (the Terraform module's nginx): plain HTTP "
        "on a non-loopback host is then intended, and start-up does not warn about it.",
    )
    http_limit_concurrency: int = Field(
        default=2048,
        ge=16,
        le=1_000_000,
        description="Open connections (or requests in progress) beyond which the API answers 503 at once.",
    )
    http_keepalive_timeout_s: float = Field(
        default=5.0, gt=0, le=3600, description="Seconds an idle keep-alive connection is kept open."
    )
    data_dir: Path = Field(
        default=Path("data"),
        description="Directory for the SQLite database, DHT identity, admin token and checkpoints.",
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL, e.g. postgresql+psycopg://user:pw@host/db. Default: SQLite in data dir.",
    )
    dht_port: int = Field(
        default=31330, ge=0, le=65535, description="Fixed TCP port of the orchestrator's DHT peer."
    )
    dht_host_maddrs: MaddrList = Field(
        default_factory=list,
        description="Comma-separated listen multiaddrs of the DHT. Default: /ip4/0.0.0.0/tcp/<dht_port>.",
    )
    dht_announce_maddrs: MaddrList = Field(
        default_factory=list,
        description="Comma-separated multiaddrs to announce (public IP behind NAT); also served by /peers.",
    )
    admin_token: SecretStr | None = Field(
        default=None,
        description="Bearer token of the admin API. Unset: generated once into <data_dir>/admin_token.",
    )
    heartbeat_interval_s: float = Field(
        default=5.0, gt=0, le=3600, description="Seconds between worker heartbeats (told to workers)."
    )
    heartbeat_timeout_s: float = Field(
        default=30.0, gt=0, le=86400, description="A worker silent this long is no longer counted live."
    )
    heartbeat_flush_interval_s: float = Field(
        default=1.0, gt=0, le=60, description="Seconds between batched writes of buffered heartbeats."
    )
    progress_sample_interval_s: float = Field(
        default=10.0, gt=0, le=3600, description="At most one stored progress sample per run this often."
    )
    averaging_window_s: float = Field(
        default=300.0,
        gt=0,
        le=86_400,
        description="Window over which a run's averaged fraction is measured (and its warning judged).",
    )
    averaging_warning_fraction: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="A run with 2+ live workers averaging fewer of its epochs than this over the whole "
        "window gets a run.averaging event and a warning.",
    )
    progress_max_points: int = Field(
        default=2000, ge=10, le=1_000_000, description="Progress samples kept per run (older ones thinned)."
    )
    tensorboard_dir: Path | None = Field(
        default=None,
        description="Also write each run's progress samples (loss, reported metrics, throughput) as "
        "TensorBoard events into <dir>/<run name>/. Needs the spotswarm[tensorboard] extra.",
    )
    dht_refresh_interval_s: float = Field(
        default=5.0, gt=0, le=3600, description="Seconds between reads of each run's swarm progress."
    )
    dht_timeout_s: float = Field(default=10.0, gt=0, le=600, description="Time limit of one DHT read.")
    max_body_bytes: int = Field(
        default=1 << 20, ge=1024, description="Largest request body accepted (checkpoints excepted)."
    )
    checkpoint_max_bytes: int = Field(
        default=4 << 30, ge=1024, description="Largest checkpoint upload accepted."
    )
    package_max_bytes: int = Field(
        default=1 << 30,
        ge=1024,
        description="Largest run code package (runs create --workdir) accepted: its upload and the bytes it "
        "unpacks to.",
    )
    install_timeout_s: float = Field(
        default=900.0,
        gt=0,
        le=86400,
        description="Time limit of installing a new run's requirements for its import check (on top of "
        "--import-timeout-s).",
    )
    installer: str = Field(
        default="auto",
        pattern=r"^(auto|uv|pip)$",
        description="What installs a run's requirements for the import check: auto (uv when installed, "
        "else pip), uv or pip. Workers read their own SPOTSWARM_INSTALLER (local ones inherit the variable).",
    )
    checkpoint_dir: Path | None = Field(
        default=None, description="Directory of the local checkpoint store. Default: <data_dir>/checkpoints."
    )
    public_reads: bool = Field(
        default=True,
        description="Serve read-only endpoints without a token (they never return secrets).",
    )
    worker_env: MaddrList = Field(
        default_factory=list,
        description="Comma-separated extra environment variables (NAME or PREFIX*) that local workers and "
        "the import probe get from the server's environment, besides the default allow-list.",
    )
    check_imports: bool = Field(
        default=True,
        description="Import each new run's module/datamodule in an isolated process to validate it.",
    )
    import_timeout_s: float = Field(
        default=60.0, gt=0, le=600, description="Time limit of one import check (includes probe start)."
    )
    shutdown_grace_s: float = Field(
        default=25.0,
        gt=0,
        le=3600,
        description="After SIGTERM or Ctrl-C, the server exits within this many seconds: open requests get "
        "up to 10, then its services and DHT peer stop; what still runs is then killed. Local workers "
        "keep running.",
    )
    log_level: str = Field(
        default="info", pattern=r"^(debug|info|warning|error)$", description="Log level of the server."
    )
    log_format: str = Field(
        default="text",
        pattern=r"^(text|json)$",
        description="Log lines: text (for people) or json (one object a line: timestamp, level, logger, "
        "run, worker, event, message).",
    )

    swarm_admission: bool = Field(
        default=True,
        description="Admit only registered workers to runs' swarms (signed peer tokens); a run opts out "
        "with strategy_options swarm_admission=false. See docs/concepts/swarm-admission.md.",
    )
    join_rate_per_s: float = Field(
        default=1.0,
        gt=0,
        le=10_000,
        description="Registrations per second a run's join token may make on average (429 beyond).",
    )
    join_burst: int = Field(
        default=20, ge=1, le=100_000, description="Registrations a run's join token may make at once."
    )
    checkpoint_min_free_bytes: int = Field(
        default=1 << 30,
        ge=0,
        description="Free disk space the upload temp dir must keep after a checkpoint upload (507 below).",
    )
    swarm_authority_key_file: Path | None = Field(
        default=None,
        description="The swarm authority's signing key (made on first start). Orchestrators sharing a "
        "database must use one key. Default: <data_dir>/swarm_authority.pem.",
    )
    swarm_token_ttl_s: float = Field(
        default=600.0, ge=10, le=86400, description="Lifetime of a swarm token; workers renew at half-life."
    )

    # The reconcile loop -------------------------------------------------------------------------------
    public_url: str | None = Field(
        default=None,
        description="URL workers reach the API at (e.g. http://10.0.0.5:8000). Default: from host and port.",
    )
    reconcile: bool = Field(
        default=True, description="Run the reconcile loop that launches and replaces workers."
    )
    reconcile_interval_s: float = Field(
        default=2.0, gt=0, le=600, description="Seconds between reconcile ticks."
    )
    launch_timeout_s: float = Field(
        default=180.0,
        gt=0,
        le=86400,
        description="A launched worker that has not registered by then has failed.",
    )
    retire_grace_s: float = Field(
        default=30.0, ge=0, le=3600, description="Seconds a worker told to leave has before it is terminated."
    )
    launch_backoff_base_s: float = Field(
        default=2.0, gt=0, le=3600, description="First delay after a start-up failure; doubles per failure."
    )
    launch_backoff_cap_s: float = Field(
        default=120.0, gt=0, le=86400, description="Longest delay between launches after start-up failures."
    )
    max_start_failures: int = Field(
        default=5, ge=1, le=1000, description="Start-up failures in a row after which a run is marked failed."
    )
    max_worker_crashes: int = Field(
        default=5,
        ge=1,
        le=10_000,
        description="Default crash budget of a run (its spec's max_worker_crashes overrides it): launched "
        "workers failing with the same error after training, within crash_window_s, before the run fails.",
    )
    crash_window_s: float = Field(
        default=3600.0,
        gt=0,
        le=30 * 86400,
        description="Seconds over which worker crashes count toward a run's crash budget.",
    )
    # AWS (the ec2 launcher and S3 checkpoints; the Terraform module sets these) -----------------------
    ec2_launch_template: str | None = Field(
        default=None, description="Worker launch template name or id; setting it enables the ec2 launcher."
    )
    ec2_orchestrator_id: str = Field(
        default="spotswarm", description="Value of the spotswarm:orchestrator tag on every instance launched."
    )
    ec2_region: str | None = Field(default=None, description="AWS region of the ec2 launcher.")
    ec2_endpoint_url: str | None = Field(
        default=None, description="EC2 API endpoint (tests point it at moto)."
    )
    ec2_worker_image: str = Field(
        default="spotswarm-worker:latest", description="Container image the worker user data starts."
    )
    ec2_instance_types: MaddrList = Field(
        default_factory=list, description="Comma-separated default instance types (a run's options override)."
    )
    ec2_subnet_ids: MaddrList = Field(
        default_factory=list, description="Comma-separated default subnets, one per zone to spread over."
    )
    ec2_max_price: str | None = Field(default=None, description="Default spot max price in USD per hour.")
    ec2_on_demand_fallback_after: int | None = Field(
        default=None, ge=1, description="Spot failures in a row after which a run falls back to on-demand."
    )
    ec2_user_data_template: Path | None = Field(
        default=None, description="Worker cloud-init template. Default: deploy/cloud-init/worker.yaml."
    )
    s3_bucket: str | None = Field(
        default=None, description="S3 bucket for checkpoints; unset: local directory."
    )
    s3_prefix: str = Field(default="spotswarm", description="Key prefix of checkpoints in the bucket.")
    s3_region: str | None = Field(default=None, description="Region of the bucket (default: ec2_region).")
    s3_endpoint_url: str | None = Field(default=None, description="S3 endpoint (tests point it at moto).")

    @field_validator(
        "dht_host_maddrs",
        "dht_announce_maddrs",
        "ec2_instance_types",
        "ec2_subnet_ids",
        "worker_env",
        mode="before",
    )
    @classmethod
    def _split_commas(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @field_validator("tensorboard_dir")
    @classmethod
    def _tensorboard_installed(cls, value: Path | None) -> Path | None:
        from orchestrator.metrics.tensorboard import tensorboard_available

        if value is not None and not tensorboard_available():
            raise ValueError("needs tensorboardX: pip install 'spotswarm[tensorboard]'")
        return value

    # Derived values -------------------------------------------------------------------------------

    def resolved_database_url(self) -> str:
        """The database URL to use: the configured one, else a SQLite file in the data dir."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'spotswarm.db').resolve()}"

    def resolved_checkpoint_dir(self) -> Path:
        return self.checkpoint_dir or self.data_dir / "checkpoints"

    def swarm_authority_key_path(self) -> Path:
        return self.swarm_authority_key_file or self.data_dir / "swarm_authority.pem"

    def dht_identity_path(self) -> Path:
        """Private key of the DHT peer: keeps its peer id (and so its multiaddrs) across restarts."""
        return self.data_dir / "dht_identity.key"

    def dht_pid_path(self) -> Path:
        """The running DHT peer's PID: the next start stops a peer that a crashed server left behind."""
        return self.data_dir / "dht.pid"

    def resolved_dht_host_maddrs(self) -> list[str]:
        return self.dht_host_maddrs or [f"/ip4/0.0.0.0/tcp/{self.dht_port}"]

    def admin_token_path(self) -> Path:
        return self.data_dir / "admin_token"


def ensure_admin_token(settings: Settings) -> tuple[str, bool]:
    """Return the admin token and whether it was generated now.

    The configured token wins; otherwise the token stored in the data dir is read, or a new one is
    generated and written there (mode 0600). Raises ``OSError`` if the data dir is not writable.
    """
    if settings.admin_token is not None:
        return settings.admin_token.get_secret_value(), False
    path = settings.admin_token_path()
    if path.exists():
        return path.read_text().strip(), False
    path.parent.mkdir(parents=True, exist_ok=True)
    token = ADMIN_TOKEN_PREFIX + secrets.token_urlsafe(32)
    if not files.create_atomic(path, token + "\n", private=True):  # another process made one meanwhile
        return path.read_text().strip(), False
    return token, True
