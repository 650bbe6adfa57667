"""The orchestrator's one settings object, read from ``SPOTSWARM_*`` environment variables or CLI flags.

Build it once (``Settings()`` or ``Settings(port=..., ...)``) and pass it to
:func:`orchestrator.app.create_app`; nothing reads settings from a global. ``spotswarm serve --help`` is
generated from the field descriptions below, so each description is the flag's documentation.

Settings of one subsystem are a section, a model of their own that the subsystem takes as it is:
``dht`` (:class:`DhtSettings`), ``reconciler`` (``ReconcileSettings``, declared beside the pure reconcile
policy, which may import nothing of the server), ``ec2`` (``Ec2Settings``, beside the ec2 launcher) and
``s3`` (:class:`S3Settings`). Users still name every setting flat, as they always have: each one has a
name (``dht_port`` for ``dht.port``: a section field's alias, else its own name) that makes its variable
``SPOTSWARM_DHT_PORT`` and its flag ``--dht-port``; ``Settings(**flags)`` takes the flat names too
(typed code passes sections: ``Settings(dht=DhtSettings(port=...))``). :meth:`Settings.setting_fields`
lists them all; ``spotswarm serve``'s flags and the settings reference page are made from it.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import AliasGenerator, BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from orchestrator import files
from orchestrator.launchers.ec2.settings import Ec2Settings
from orchestrator.reconciler.policy import ReconcileSettings
from worker.protocol.comma_list import CommaList

logger = logging.getLogger(__name__)

ENV_PREFIX = "SPOTSWARM_"
ADMIN_TOKEN_PREFIX = "ssa_"


def _flat_names(prefix: str) -> ConfigDict:
    """A section whose fields are named ``<prefix><field>`` (``dht_port``), by name or by that alias."""
    return ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=AliasGenerator(validation_alias=lambda name: f"{prefix}{name}"),
        validate_by_name=True,
        validate_by_alias=True,
    )


class DhtSettings(BaseModel):
    """The orchestrator's DHT peer (``SPOTSWARM_DHT_*``, ``--dht-*``)."""

    model_config = _flat_names("dht_")

    port: int = Field(
        default=31330, ge=0, le=65535, description="Fixed TCP port of the orchestrator's DHT peer."
    )
    host_maddrs: CommaList = Field(
        default_factory=list,
        description="Comma-separated listen multiaddrs of the DHT. Default: /ip4/0.0.0.0/tcp/<dht_port>.",
    )
    announce_maddrs: CommaList = Field(
        default_factory=list,
        description="Comma-separated multiaddrs to announce (public IP behind NAT); also served by /peers.",
    )
    refresh_interval_s: float = Field(
        default=5.0, gt=0, le=3600, description="Seconds between reads of each run's swarm progress."
    )
    timeout_s: float = Field(default=10.0, gt=0, le=600, description="Time limit of one DHT read.")

    def resolved_host_maddrs(self) -> list[str]:
        """Where the DHT peer listens: the configured multiaddrs, else every IPv4 interface on ``port``."""
        return self.host_maddrs or [f"/ip4/0.0.0.0/tcp/{self.port}"]


class S3Settings(BaseModel):
    """Checkpoints in S3 (``SPOTSWARM_S3_*``, ``--s3-*``); without a bucket they stay on local disk."""

    model_config = _flat_names("s3_")

    bucket: str | None = Field(default=None, description="S3 bucket for checkpoints; unset: local directory.")
    prefix: str = Field(default="spotswarm", description="Key prefix of checkpoints in the bucket.")
    region: str | None = Field(default=None, description="Region of the bucket (default: ec2_region).")
    endpoint_url: str | None = Field(default=None, description="S3 endpoint (tests point it at moto).")


@dataclass(frozen=True)
class SettingField:
    """One setting as users name it: ``name`` makes its variable (``SPOTSWARM_<NAME>``) and its flag
    (``--<name>``); ``path`` is where it lives in :class:`Settings` (``("dht", "port")``)."""

    name: str
    path: tuple[str, ...]
    field: FieldInfo

    @property
    def env(self) -> str:
        return f"{ENV_PREFIX}{self.name.upper()}"


def _section(field: FieldInfo) -> type[BaseModel] | None:
    """The section model a field of :class:`Settings` holds, or None for a plain setting."""
    annotation = field.annotation
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


class Settings(BaseSettings):
    """Everything `spotswarm serve` can be told: each setting is ``SPOTSWARM_<NAME>`` and ``--<name>``,
    a section's fields included (:meth:`setting_fields`)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, validate_default=True)

    host: str = Field(default="127.0.0.1", description="Address the HTTP API binds to (0.0.0.0 for all).")
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port of the HTTP API.")
    tls_proxy: bool = Field(
        default=False,
        description="A TLS-terminating reverse proxy is in front (the Terraform module's nginx): plain HTTP "
        "on a non-loopback host is then intended, and start-up does not warn about it.",
    )
    trusted_hosts: CommaList = Field(
        default_factory=list,
        description="Comma-separated host names the API answers to (*.example.com for a domain's names, * "
        "for any), besides localhost, the host of --host and of --public-url, and IP addresses. A request "
        "naming another host in its Host header gets 400: a web page on a name made to resolve to this "
        "server (DNS rebinding) cannot read the API.",
    )
    http_limit_concurrency: int = Field(
        default=2048,
        ge=16,
        le=1_000_000,
        description="Open connections (or requests in progress) beyond which the API answers 503 at once.",
    )
    http_header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="Seconds a connection has to send a request's whole header (from opening, or from its "
        "previous answer) before it is closed: half-open connections cannot pile up.",
    )
    http_max_connections_per_client: int = Field(
        default=256,
        ge=0,
        le=1_000_000,
        description="Open connections one client address may hold; beyond, new ones are closed at once, so "
        "one client cannot take all of --http-limit-concurrency. 0: no cap. Not applied with --tls-proxy "
        "(every connection comes from the proxy, which keeps its own per-client limits).",
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
    dht: DhtSettings = Field(default_factory=DhtSettings)
    admin_token: SecretStr | None = Field(
        default=None,
        description="Bearer token of the admin API. Unset: generated once into <data_dir>/admin_token.",
    )
    heartbeat_interval_s: float = Field(
        default=5.0, gt=0, le=3600, description="Seconds between worker heartbeats (told to workers)."
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
    averaging_apart_epochs: int = Field(
        default=5,
        ge=1,
        le=1_000_000,
        description="A running run whose 2+ live workers have each applied this many epochs on their own "
        "gradients, none of them averaged yet, is warned (its swarm has not formed) once that has "
        "lasted averaging_apart_s, however short the run.",
    )
    averaging_apart_s: float = Field(
        default=10.0,
        ge=0,
        le=3600,
        description="How long 2+ live workers must train apart (see averaging_apart_epochs) before the "
        "warning: a healthy swarm's first round can take a few seconds after its second worker's first "
        "epochs.",
    )
    progress_max_points: int = Field(
        default=2000, ge=10, le=1_000_000, description="Progress samples kept per run (older ones thinned)."
    )
    tensorboard_dir: Path | None = Field(
        default=None,
        description="Also write each run's progress samples (loss, reported metrics, throughput) as "
        "TensorBoard events into <dir>/<run name>/. Needs the spotswarm[tensorboard] extra.",
    )
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
    package_orphan_grace_s: float = Field(
        default=3600.0,
        gt=0,
        description="A run code package no run names is deleted once it is older than this: an upload whose "
        "create never came (a refused create deletes its package at once).",
    )
    package_sweep_interval_s: float = Field(
        default=600.0, gt=0, description="How often packages no run names are looked for (and at start)."
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
    worker_env: CommaList = Field(
        default_factory=list,
        description="Comma-separated extra environment variables (NAME or PREFIX*) that local workers and "
        "the import probe get from the server's environment, besides the default allow-list.",
    )
    local_preload: bool = Field(
        default=True,
        description="Fork local workers from a process that has imported Lightning, torch and hivemind "
        "(started with the server when it runs its reconcile loop or checks imports, else at the first local "
        "launch), so each skips the about 5 s of CPU those imports take; "
        "false starts each worker in a fresh interpreter.",
    )
    local_spot_market: Path | None = Field(
        default=None,
        description="A JSON file describing a simulated spot market the local launcher obeys (a capacity "
        "trace or a seeded random market, its slots and time compression): launches beyond its capacity "
        "fail as InsufficientInstanceCapacity, and workers it reclaims get a spot notice. Off when unset.",
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
    reconciler: ReconcileSettings = Field(default_factory=ReconcileSettings)
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
    ec2: Ec2Settings = Field(default_factory=Ec2Settings)
    s3: S3Settings = Field(default_factory=S3Settings)

    # Names and sources ---------------------------------------------------------------------------

    @classmethod
    @functools.cache
    def setting_fields(cls) -> tuple[SettingField, ...]:
        """Every setting in declaration order, a section's fields where the section is declared."""
        fields: list[SettingField] = []
        for name, field in cls.model_fields.items():
            section = _section(field)
            if section is None:
                fields.append(SettingField(name, (name,), field))
                continue
            for key, inner in section.model_fields.items():
                alias = inner.validation_alias
                fields.append(SettingField(alias if isinstance(alias, str) else key, (name, key), inner))
        return tuple(fields)

    @classmethod
    def setting_name(cls, location: tuple[int | str, ...]) -> str:
        """A validation error's location as users name it: ``("dht", "port")`` -> ``dht_port``."""
        for setting in cls.setting_fields():
            if location[: len(setting.path)] == setting.path:
                return ".".join(map(str, (setting.name, *location[len(setting.path) :])))
        return ".".join(map(str, location))

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Keywords (flags) over the environment; no ``.env`` file, no secrets directory."""
        return init_settings, _FlatEnvSource(settings_cls)

    @model_validator(mode="before")
    @classmethod
    def _nest_flat_names(cls, data: Any) -> Any:
        """Keywords and flags may name a section's field flat (``dht_port=4000``): move each into its
        section, over what the environment put there."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for setting in cls.setting_fields():
            if len(setting.path) == 2 and setting.name in data:
                section, key = setting.path
                given = data.get(section)
                values = given.model_dump() if isinstance(given, BaseModel) else dict(given or {})
                values[key] = data.pop(setting.name)
                data[section] = values
        return data

    @field_validator("tensorboard_dir")
    @classmethod
    def _tensorboard_installed(cls, value: Path | None) -> Path | None:
        # The TensorBoard forwarder (``metrics/tensorboard.py``) writes with tensorboardX.
        if value is not None and importlib.util.find_spec("tensorboardX") is None:
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

    def allowed_hosts(self) -> list[str]:
        """Host names a request may name (IP addresses always may): ``trusted_hosts``, ``localhost``,
        and the names the server is bound and published as (``host``, ``public_url``)."""
        published = (self.host, urlsplit(self.public_url).hostname if self.public_url else None)
        wildcard = ("0.0.0.0", "::")
        names = ["localhost", *self.trusted_hosts, *(n for n in published if n and n not in wildcard)]
        return list(dict.fromkeys(name.lower() for name in names))

    def admin_token_path(self) -> Path:
        return self.data_dir / "admin_token"


class _FlatEnvSource(EnvSettingsSource):
    """pydantic-settings' environment source, except that a section's fields are read from their flat
    variables (``SPOTSWARM_DHT_PORT`` for ``dht.port``), not from one JSON variable per section."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        if _section(field) is not None:
            return None, field_name, False  # read field by field in __call__
        return super().get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        data = super().__call__()
        for setting in Settings.setting_fields():
            if len(setting.path) != 2:
                continue
            variable = f"{self.env_prefix}{setting.name}"
            value = self.env_vars.get(variable if self.case_sensitive else variable.lower())
            if value is not None:
                section, key = setting.path
                data.setdefault(section, {})[key] = value
        return data


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
