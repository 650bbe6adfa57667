"""The generators of the site's reference pages (``docs/hooks/``), and the links of the pages read outside
the site (README.md, CONTRIBUTING.md, CHANGELOG.md).

The settings generator is checked against pydantic-settings itself: the environment variable it
documents for a field, nested ones included, is the one that sets that field.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from types import ModuleType
from typing import Any

import click
import pytest
from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from orchestrator.cli.serve import serve
from orchestrator.config import ENV_PREFIX, Settings
from tests.support.processes import REPO_ROOT


def _hook(name: str) -> ModuleType:
    """A module of ``docs/hooks/`` (not a package: mkdocs loads hooks by path), imported by path too."""
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "docs" / "hooks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = sys.modules.setdefault(name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


settings_reference = _hook("settings_reference")
openapi_reference = _hook("openapi_reference")


class Loop(BaseModel):
    interval_s: float = Field(default=2.0, description="Seconds between <ticks>.")
    max_bytes: int = Field(default=4 << 30, description="Largest upload.")


class Nested(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPOTSWARM_", env_nested_delimiter="__")
    host: str = Field(default="127.0.0.1", description="Where to listen.")
    reconcile: bool = Field(default=True, description="Run the loop.")
    loop: Loop = Field(default_factory=Loop)


class NestedAsJson(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPOTSWARM_")
    loop: Loop = Field(default_factory=Loop)


@click.command()
@click.option("--host", "host")
@click.option("--reconcile/--no-reconcile", "reconcile", default=None)
@click.option("--loop-interval-s", "loop_interval_s", type=float)
def nested_serve(**_: Any) -> None:
    """A command spelling a nested field as ``--section-field``."""


def test_nested_fields_get_the_variable_pydantic_settings_reads_and_the_flag_the_command_has(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = {row.path: row for row in settings_reference.setting_rows(Nested, nested_serve)}
    assert list(rows) == [("host",), ("reconcile",), ("loop", "interval_s"), ("loop", "max_bytes")]
    interval = rows[("loop", "interval_s")]
    assert (interval.flag, interval.env, interval.default) == (
        "--loop-interval-s",
        "SPOTSWARM_LOOP__INTERVAL_S",
        "2",
    )
    assert rows[("loop", "max_bytes")].flag is None and rows[("loop", "max_bytes")].default == "4 GiB"
    assert rows[("reconcile",)].flag == "--reconcile/--no-reconcile" and rows[("reconcile",)].default == "on"

    monkeypatch.setenv(interval.env, "7.5")
    assert Nested().loop.interval_s == 7.5


def test_without_a_nested_delimiter_a_section_is_documented_as_its_parents_json_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    [interval, _] = settings_reference.setting_rows(NestedAsJson)
    assert interval.env == "SPOTSWARM_LOOP (JSON)"
    monkeypatch.setenv("SPOTSWARM_LOOP", '{"interval_s": 3}')
    assert NestedAsJson().loop.interval_s == 3


def test_the_page_gives_each_setting_an_anchor_and_shows_placeholders_as_text() -> None:
    page = settings_reference.settings_markdown(Nested, nested_serve, "Settings", "All of them.")
    assert "## `loop`\n" in page and "### `loop.interval_s`\n" in page and "## `host`\n" in page
    assert "Seconds between &lt;ticks&gt;." in page
    assert "no flag · variable `SPOTSWARM_LOOP__MAX_BYTES` · default 4 GiB" in page


def test_every_setting_of_the_orchestrator_has_its_flag_and_its_variable() -> None:
    """A section's fields keep the flat names the model gives them (``dht.port``: ``--dht-port``,
    ``SPOTSWARM_DHT_PORT``); tests/unit/test_settings_names.py checks that they set what they say."""
    rows = list(settings_reference.setting_rows(Settings, serve))
    settings = Settings.setting_fields()
    assert [row.path for row in rows] == [setting.path for setting in settings]
    assert ("dht", "port") in [row.path for row in rows]
    for row, setting in zip(rows, settings, strict=True):
        assert row.flag is not None, f"{row.path}: no option of `spotswarm serve` sets it"
        assert row.flag.split("/")[0] == "--" + setting.name.replace("_", "-")
        assert row.env == f"{ENV_PREFIX}{setting.name.upper()}"
        assert row.description, f"{row.path}: no description"


def _operation(**responses: str) -> dict[str, Any]:
    return {"responses": {status: {"description": text} for status, text in responses.items()}}


def test_error_answers_every_operation_shares_are_listed_once() -> None:
    document = {
        "paths": {
            "/api/v1/runs": {"get": _operation(**{"200": "ok", "401": "no token", "409": "conflict"})},
            "/api/v1/runs/{name}": {"post": _operation(**{"201": "made", "401": "no token", "409": "taken"})},
            "/healthz": {"get": _operation(**{"200": "alive"})},
        }
    }
    assert openapi_reference.shared_responses(document, "/api/") == {"401": "no token"}
    trimmed = openapi_reference.without_responses(document, "/api/", {"401"})
    assert set(trimmed["paths"]["/api/v1/runs"]["get"]["responses"]) == {"200", "409"}
    assert set(document["paths"]["/api/v1/runs"]["get"]["responses"]) == {"200", "401", "409"}  # a copy
    page = openapi_reference.openapi_markdown(
        {"openapi": "3.1.0", "info": {"title": "t", "version": "1"}, **document}, "REST API", "Intro."
    )
    assert page.startswith("# REST API\n\nIntro.\n") and "| 401 | no token |" in page


@pytest.mark.parametrize("name", ["README.md", "CONTRIBUTING.md", "CHANGELOG.md"])
def test_relative_links_outside_the_site_point_at_files_that_exist(name: str) -> None:
    text = (REPO_ROOT / name).read_text()
    targets = [t for t in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) if "://" not in t]
    assert targets, f"{name} links nowhere"
    missing = [t for t in targets if not (REPO_ROOT / t).exists()]
    assert missing == [], missing
