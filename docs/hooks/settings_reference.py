"""The settings reference page, generated from a pydantic-settings model and the click command that
exposes it (``spotswarm serve``), so the page cannot disagree with the code.

Each field gives one row: its dotted path, the command-line flag the command really has for it (looked
up among the command's options, never derived), its environment variable, its default and its
description. A field whose annotation is a pydantic model gets a section of its own, recursively.

The variable follows pydantic-settings' rules (``env_prefix`` plus the field name, nested fields joined
by ``env_nested_delimiter``; without a delimiter a nested model is set as JSON in its parent's
variable), unless the model names its settings itself: a ``setting_fields()`` classmethod giving each
field's ``path`` and ``name`` (``orchestrator.config.Settings`` reads ``dht.port`` from
``SPOTSWARM_DHT_PORT``, and its flag is ``--dht-port``).
"""

from __future__ import annotations

import enum
import html
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

UNSET = "unset"
_BYTE_UNITS = ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


@dataclass(frozen=True)
class SettingRow:
    """One documented setting."""

    path: tuple[str, ...]  # ("reconcile", "interval_s") for a nested field
    flag: str | None  # "--reconcile-interval-s" or "--reconcile/--no-reconcile"; None: no flag
    env: str  # "SPOTSWARM_RECONCILE__INTERVAL_S", or the parent's variable with " (JSON)"
    default: str
    description: str


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation names (``Model`` or ``Model | None``), else None."""
    candidates = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else ()
    if typing.get_origin(annotation) is typing.Union:
        candidates = typing.get_args(annotation)
    for candidate in candidates or (annotation,):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def format_default(field: FieldInfo, name: str) -> str:
    """A default as a reader would write it: ``unset`` for None or empty, sizes in binary units."""
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None or value == [] or isinstance(value, SecretStr):
        return UNSET
    if isinstance(value, BaseModel):
        return "(section below)"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, int) and name.endswith("_bytes"):
        for size, unit in _BYTE_UNITS:
            if value >= size and value % size == 0:
                return f"{value // size} {unit}"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def _option_flags(command: click.Command) -> dict[str, str]:
    """Each option's destination name -> how it is written (``--x`` or ``--x/--no-x``)."""
    flags: dict[str, str] = {}
    for param in command.params:
        if isinstance(param, click.Option) and param.name:
            flag = max(param.opts, key=len)
            if param.secondary_opts:
                flag += "/" + max(param.secondary_opts, key=len)
            flags[param.name] = flag
    return flags


def _flag_for(path: tuple[str, ...], flags: dict[str, str], name: str | None = None) -> str | None:
    """The option whose destination is this field, however the command spells nested names."""
    for candidate in (name, "_".join(path), "__".join(path), ".".join(path)):
        if candidate in flags:
            return flags[candidate]
    return None


def setting_rows(model: type[BaseModel], command: click.Command | None = None) -> Iterator[SettingRow]:
    """Every leaf field of ``model``, nested models depth first, in declaration order."""
    config = getattr(model, "model_config", {})
    prefix = str(config.get("env_prefix", ""))
    delimiter = config.get("env_nested_delimiter") or None
    flags = _option_flags(command) if command is not None else {}
    own_names = getattr(model, "setting_fields", None)
    names = {setting.path: setting.name for setting in own_names()} if own_names is not None else {}
    yield from _rows(model, (), prefix, delimiter, flags, json_parent=None, names=names)


def _env_name(
    field: FieldInfo,
    path: tuple[str, ...],
    prefix: str,
    delimiter: str | None,
    names: dict[tuple[str, ...], str],
) -> str:
    if path in names:
        return (prefix + names[path]).upper()  # the model's own name for it
    alias = field.validation_alias if isinstance(field.validation_alias, str) else field.alias
    if alias and len(path) == 1:
        return alias.upper()  # pydantic-settings reads an alias without the prefix
    return (prefix + (delimiter or "_").join(path)).upper()


def _rows(
    model: type[BaseModel],
    parent: tuple[str, ...],
    prefix: str,
    delimiter: str | None,
    flags: dict[str, str],
    json_parent: str | None,
    names: dict[tuple[str, ...], str],
) -> Iterator[SettingRow]:
    for name, field in model.model_fields.items():
        path = (*parent, name)
        env = json_parent or _env_name(field, path, prefix, delimiter, names)
        nested = _model_of(field.annotation)
        if nested is not None:
            # Without a delimiter the whole section is one JSON variable; with one, or with the model's own
            # names, each field has its own.
            own = delimiter or any(known[: len(path)] == path for known in names)
            yield from _rows(nested, path, prefix, delimiter, flags, None if own else f"{env} (JSON)", names)
            continue
        yield SettingRow(
            path=path,
            flag=_flag_for(path, flags, names.get(path)),
            env=env,
            default=format_default(field, name),
            description=" ".join((field.description or "").split()),
        )


def _text(text: str) -> str:
    """Prose from a description: ``<data_dir>``-style placeholders shown, not taken for HTML tags."""
    return html.escape(text, quote=False)


def settings_markdown(model: type[BaseModel], command: click.Command | None, title: str, intro: str) -> str:
    """The whole page: one entry per setting (a heading, so each can be linked to), the top-level ones
    first, then a section per nested model."""
    lines = [f"# {title}", "", intro.strip(), ""]
    section: tuple[str, ...] = ()
    for row in setting_rows(model, command):
        if row.path[:-1] != section:
            section = row.path[:-1]
            lines += [f"## `{'.'.join(section)}`", ""]
        level = "###" if section else "##"
        flag = f"flag `{row.flag}`" if row.flag else "no flag"
        lines += [
            f"{level} `{'.'.join(row.path)}`",
            "",
            f"{flag} · variable `{row.env}` · default {_text(row.default)}",
            "",
            _text(row.description) or "(no description)",
            "",
        ]
    return "\n".join(lines)
