"""The orchestrator's settings keep their names: every ``SPOTSWARM_*`` variable and ``spotswarm serve``
flag that users, the Terraform module, cloud-init and docker-compose set still sets the same setting,
now that the settings are grouped into sections (``dht``, ``reconciler``, ``ec2``, ``s3``).

The table below is written out by hand (variable, value, where it lands, what it becomes), so it checks
the names against what they were, not against the model's own idea of them; and it must cover every
variable the settings reference page documents.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from pydantic import SecretStr

from orchestrator.cli.serve import build_settings, serve
from orchestrator.config import Settings
from tests.support.processes import REPO_ROOT, clear_spotswarm_env

# variable (without SPOTSWARM_), raw value, attribute path, parsed value
NAMES: list[tuple[str, str, str, Any]] = [
    ("HOST", "0.0.0.0", "host", "0.0.0.0"),
    ("PORT", "8123", "port", 8123),
    ("TLS_PROXY", "true", "tls_proxy", True),
    ("TRUSTED_HOSTS", "a.example, *.b.example", "trusted_hosts", ["a.example", "*.b.example"]),
    ("HTTP_LIMIT_CONCURRENCY", "100", "http_limit_concurrency", 100),
    ("HTTP_HEADER_TIMEOUT_S", "4.5", "http_header_timeout_s", 4.5),
    ("HTTP_MAX_CONNECTIONS_PER_CLIENT", "64", "http_max_connections_per_client", 64),
    ("HTTP_KEEPALIVE_TIMEOUT_S", "7.5", "http_keepalive_timeout_s", 7.5),
    ("DATA_DIR", "/srv/spotswarm", "data_dir", Path("/srv/spotswarm")),
    ("DATABASE_URL", "postgresql+psycopg://u:p@db/ss", "database_url", "postgresql+psycopg://u:p@db/ss"),
    ("DHT_PORT", "4000", "dht.port", 4000),
    ("DHT_HOST_MADDRS", "/ip4/10.0.0.5/tcp/4000, /ip6/::/tcp/4000", "dht.host_maddrs",
     ["/ip4/10.0.0.5/tcp/4000", "/ip6/::/tcp/4000"]),
    ("DHT_ANNOUNCE_MADDRS", "/ip4/1.2.3.4/tcp/4000", "dht.announce_maddrs", ["/ip4/1.2.3.4/tcp/4000"]),
    ("DHT_REFRESH_INTERVAL_S", "3", "dht.refresh_interval_s", 3.0),
    ("DHT_TIMEOUT_S", "4", "dht.timeout_s", 4.0),
    ("ADMIN_TOKEN", "ssa_given", "admin_token", SecretStr("ssa_given")),
    ("HEARTBEAT_INTERVAL_S", "6", "heartbeat_interval_s", 6.0),
    ("HEARTBEAT_FLUSH_INTERVAL_S", "0.5", "heartbeat_flush_interval_s", 0.5),
    ("PROGRESS_SAMPLE_INTERVAL_S", "20", "progress_sample_interval_s", 20.0),
    ("AVERAGING_WINDOW_S", "600", "averaging_window_s", 600.0),
    ("AVERAGING_WARNING_FRACTION", "0.25", "averaging_warning_fraction", 0.25),
    ("AVERAGING_APART_EPOCHS", "8", "averaging_apart_epochs", 8),
    ("AVERAGING_APART_S", "20", "averaging_apart_s", 20.0),
    ("PROGRESS_MAX_POINTS", "500", "progress_max_points", 500),
    ("TENSORBOARD_DIR", "/srv/tb", "tensorboard_dir", Path("/srv/tb")),
    ("MAX_BODY_BYTES", "2097152", "max_body_bytes", 2 << 20),
    ("CHECKPOINT_MAX_BYTES", "1073741824", "checkpoint_max_bytes", 1 << 30),
    ("PACKAGE_MAX_BYTES", "536870912", "package_max_bytes", 512 << 20),
    ("PACKAGE_ORPHAN_GRACE_S", "7200", "package_orphan_grace_s", 7200.0),
    ("PACKAGE_SWEEP_INTERVAL_S", "60", "package_sweep_interval_s", 60.0),
    ("INSTALL_TIMEOUT_S", "1200", "install_timeout_s", 1200.0),
    ("INSTALLER", "pip", "installer", "pip"),
    ("CHECKPOINT_DIR", "/srv/ckpt", "checkpoint_dir", Path("/srv/ckpt")),
    ("PUBLIC_READS", "false", "public_reads", False),
    ("WORKER_ENV", "HF_TOKEN, WANDB_*", "worker_env", ["HF_TOKEN", "WANDB_*"]),
    ("LOCAL_PRELOAD", "false", "local_preload", False),
    ("LOCAL_SPOT_MARKET", "/srv/market.json", "local_spot_market", Path("/srv/market.json")),
    ("CHECK_IMPORTS", "false", "check_imports", False),
    ("IMPORT_TIMEOUT_S", "90", "import_timeout_s", 90.0),
    ("SHUTDOWN_GRACE_S", "40", "shutdown_grace_s", 40.0),
    ("LOG_LEVEL", "debug", "log_level", "debug"),
    ("LOG_FORMAT", "json", "log_format", "json"),
    ("SWARM_ADMISSION", "false", "swarm_admission", False),
    ("JOIN_RATE_PER_S", "2.5", "join_rate_per_s", 2.5),
    ("JOIN_BURST", "7", "join_burst", 7),
    ("CHECKPOINT_MIN_FREE_BYTES", "0", "checkpoint_min_free_bytes", 0),
    ("SWARM_AUTHORITY_KEY_FILE", "/srv/key.pem", "swarm_authority_key_file", Path("/srv/key.pem")),
    ("SWARM_TOKEN_TTL_S", "900", "swarm_token_ttl_s", 900.0),
    ("PUBLIC_URL", "http://10.0.0.5:8000", "public_url", "http://10.0.0.5:8000"),
    ("RECONCILE", "false", "reconciler.enabled", False),
    ("RECONCILE_INTERVAL_S", "1.5", "reconciler.interval_s", 1.5),
    ("HEARTBEAT_TIMEOUT_S", "45", "reconciler.heartbeat_timeout_s", 45.0),
    ("MANUAL_LOST_END_S", "600", "reconciler.manual_lost_end_s", 600.0),
    ("LAUNCH_TIMEOUT_S", "300", "reconciler.launch_timeout_s", 300.0),
    ("RETIRE_GRACE_S", "12", "reconciler.retire_grace_s", 12.0),
    ("LAUNCH_BACKOFF_BASE_S", "4", "reconciler.launch_backoff_base_s", 4.0),
    ("LAUNCH_BACKOFF_CAP_S", "60", "reconciler.launch_backoff_cap_s", 60.0),
    ("MAX_START_FAILURES", "9", "reconciler.max_start_failures", 9),
    ("MAX_WORKER_CRASHES", "3", "max_worker_crashes", 3),
    ("CRASH_WINDOW_S", "7200", "crash_window_s", 7200.0),
    ("EC2_LAUNCH_TEMPLATE", "lt-0abc", "ec2.launch_template", "lt-0abc"),
    ("EC2_ORCHESTRATOR_ID", "team-a", "ec2.orchestrator_id", "team-a"),
    ("EC2_REGION", "eu-west-1", "ec2.region", "eu-west-1"),
    ("EC2_ENDPOINT_URL", "http://127.0.0.1:5000", "ec2.endpoint_url", "http://127.0.0.1:5000"),
    ("EC2_WORKER_IMAGE", "registry.example/w:1.0", "ec2.worker_image", "registry.example/w:1.0"),
    ("EC2_INSTANCE_TYPES", "g5.xlarge, g4dn.xlarge", "ec2.instance_types", ["g5.xlarge", "g4dn.xlarge"]),
    ("EC2_SUBNET_IDS", "subnet-a,subnet-b", "ec2.subnet_ids", ["subnet-a", "subnet-b"]),
    ("EC2_MAX_PRICE", "0.9", "ec2.max_price", "0.9"),
    ("EC2_ON_DEMAND_FALLBACK_AFTER", "3", "ec2.on_demand_fallback_after", 3),
    ("EC2_USER_DATA_TEMPLATE", "/srv/worker.yaml", "ec2.user_data_template", Path("/srv/worker.yaml")),
    ("S3_BUCKET", "ckpts", "s3.bucket", "ckpts"),
    ("S3_PREFIX", "team-a/ckpt", "s3.prefix", "team-a/ckpt"),
    ("S3_REGION", "eu-central-1", "s3.region", "eu-central-1"),
    ("S3_ENDPOINT_URL", "http://127.0.0.1:5001", "s3.endpoint_url", "http://127.0.0.1:5001"),
]  # fmt: skip


def _hook(name: str) -> Any:
    sys.path.insert(0, str(REPO_ROOT / "docs" / "hooks"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    clear_spotswarm_env(monkeypatch)
    return monkeypatch


def _value(settings: Settings, path: str) -> Any:
    value: Any = settings
    for part in path.split("."):
        value = getattr(value, part)
    return value


def _assert_all_set(settings: Settings) -> None:
    for variable, _, path, expected in NAMES:
        actual = _value(settings, path)
        if isinstance(expected, SecretStr):
            actual, expected = actual.get_secret_value(), expected.get_secret_value()
        assert actual == expected, (variable, path, actual)


def _flag(variable: str, raw: str) -> list[str]:
    """The ``spotswarm serve`` arguments that set ``variable`` to ``raw`` (flags are the lower-case,
    dashed variable names; a boolean is ``--x`` or ``--no-x``)."""
    flag = "--" + variable.lower().replace("_", "-")
    if raw in ("true", "false"):
        return [flag if raw == "true" else flag.replace("--", "--no-", 1)]
    return [flag, raw]


def test_the_table_covers_every_documented_variable() -> None:
    documented = [row.env for row in _hook("settings_reference").setting_rows(Settings, serve)]
    assert sorted(documented) == sorted(f"SPOTSWARM_{variable}" for variable, *_ in NAMES)


def test_each_variable_sets_its_setting(clean_env: pytest.MonkeyPatch) -> None:
    for variable, raw, _, _ in NAMES:
        clean_env.setenv(f"SPOTSWARM_{variable}", raw)
    _assert_all_set(Settings())


def test_each_flag_sets_its_setting(clean_env: pytest.MonkeyPatch) -> None:
    args = [arg for variable, raw, _, _ in NAMES for arg in _flag(variable, raw)]
    context = serve.make_context("serve", args)
    _assert_all_set(build_settings(context.params))


def test_a_flag_wins_over_its_variable_and_the_section_keeps_the_other_variables(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("SPOTSWARM_DHT_PORT", "4000")
    clean_env.setenv("spotswarm_dht_timeout_s", "3")  # names are matched without regard to case
    clean_env.setenv("SPOTSWARM_RECONCILE", "false")
    settings = build_settings(serve.make_context("serve", ["--dht-port", "5000", "--reconcile"]).params)
    assert (settings.dht.port, settings.dht.timeout_s, settings.reconciler.enabled) == (5000, 3.0, True)
    keywords = Settings(dht_port=6000, launch_timeout_s=9)  # the flat names work as keywords too
    assert (keywords.dht.port, keywords.dht.timeout_s, keywords.reconciler.launch_timeout_s) == (6000, 3.0, 9)
    assert keywords.reconciler.enabled is False


def test_an_invalid_setting_is_named_as_users_set_it(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("SPOTSWARM_EC2_ON_DEMAND_FALLBACK_AFTER", "-1")
    with pytest.raises(click.UsageError) as error:
        build_settings({"dht_port": 70000})
    message = error.value.message
    assert message.startswith("invalid settings: ") and "dht_port: " in message, message
    assert "ec2_on_demand_fallback_after: " in message and "dht.port" not in message, message


def test_what_the_terraform_module_writes_for_its_null_defaults_means_unset(
    clean_env: pytest.MonkeyPatch,
) -> None:
    """terraform/orchestrator.tf writes an empty value for a null ``worker_max_price`` or
    ``on_demand_fallback_after`` (the defaults), and allows a fallback after 0 failures."""
    clean_env.setenv("SPOTSWARM_EC2_MAX_PRICE", "")
    clean_env.setenv("SPOTSWARM_EC2_ON_DEMAND_FALLBACK_AFTER", "")
    settings = Settings()
    assert (settings.ec2.max_price, settings.ec2.on_demand_fallback_after) == (None, None)
    clean_env.setenv("SPOTSWARM_EC2_ON_DEMAND_FALLBACK_AFTER", "0")
    assert Settings().ec2.on_demand_fallback_after == 0
    module = (REPO_ROOT / "terraform" / "orchestrator.tf").read_text()
    for variable in ("SPOTSWARM_EC2_MAX_PRICE", "SPOTSWARM_EC2_ON_DEMAND_FALLBACK_AFTER"):
        assert re.search(rf'{variable}\s*=\s*var\.\w+ == null \? ""', module), variable
