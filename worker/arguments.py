"""Keyword arguments of a run spec checked against the annotations of the class they are for.

A run's ``module_args`` and ``datamodule_args`` are JSON and reach the user's constructor as they are: a
worker converts nothing. A value of the wrong type (``channels: int`` given ``"sixteen"``) would fail
inside the user's code on every worker, with whatever error that code happens to raise. The create-time
probe (``worker/agent/probe.py``) and the agent (``worker/agent/boot.py``) both ask
:func:`argument_type_problem`, so the run is refused when it is created, naming the argument.

Only plain annotations are checked (``int``, ``float``, ``str``, ``bool``, ``None``, ``Literal``, and
lists, tuples, dicts and unions of them), as JSON values would be (an int is a float; a bool is not an
int; a list is a tuple). An annotation that names anything else (a tensor, a class of the user's, ``Any``)
or that cannot be resolved is not checked: the user's code may accept more than it says, and only
building the object tells.
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

_PLAIN_TYPES = frozenset({int, float, str, bool, type(None)})
_CONTAINERS = frozenset({list, tuple, dict, set, frozenset, Sequence, Mapping})
_STRICT = ConfigDict(strict=True)


def argument_type_problem(factory: Any, args: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, reason) of the first of ``args`` whose value does not fit ``factory``'s annotation of it,
    e.g. ``("channels", "expected int, got 'sixteen'")``; None when every checked value fits."""
    annotations = _annotations(factory)
    for name, value in args.items():
        annotation = annotations.get(name)
        if annotation is None or not _plain(annotation):
            continue
        try:
            TypeAdapter(annotation, config=_STRICT).validate_json(json.dumps(value))
        except (ValidationError, TypeError, ValueError):
            return name, f"expected {_describe(annotation)}, got {value!r}"
    return None


def _annotations(factory: Any) -> dict[str, Any]:
    """The resolved annotations of ``factory``'s constructor parameters ({} when they cannot be read)."""
    target = factory.__init__ if inspect.isclass(factory) else factory
    try:
        hints = typing.get_type_hints(target)
        params = inspect.signature(factory).parameters
    except Exception:  # noqa: BLE001 - any annotation that does not resolve (user code) means: not checked
        return {}
    return {name: hints[name] for name in params if name in hints}


def _plain(annotation: Any) -> bool:
    """Whether ``annotation`` is made of JSON-like types only (see the module docstring)."""
    if annotation in _PLAIN_TYPES or annotation in _CONTAINERS:
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return all(isinstance(v, (int, float, str, bool, type(None))) for v in typing.get_args(annotation))
    if origin is typing.Annotated:
        return _plain(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType) or origin in _CONTAINERS:
        return all(arg is Ellipsis or _plain(arg) for arg in typing.get_args(annotation))
    return False


def _describe(annotation: Any) -> str:
    """``int``, ``list[int]``, ``int | None``: the annotation as its source would spell it."""
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return "None" if annotation is type(None) else annotation.__name__
    return str(annotation).replace("typing.", "").replace("NoneType", "None")
