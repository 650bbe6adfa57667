"""Validators and bounds every model of the wire format uses: plain text, plain JSON, import paths.

Pydantic only. Counters are stored as signed 64-bit integers and counts as 32-bit ones: larger values are
refused at the edge (:data:`MAX_INT64`, :data:`MAX_INT32`) instead of failing in the database, where one
bad heartbeat would poison a whole batch.
"""

from __future__ import annotations

import json
import re
from enum import Enum
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

MAX_INT64 = 2**63 - 1
MAX_INT32 = 2**31 - 1
#: The largest id a path or query takes (ids are 32-bit in the database); larger ones are refused at the edge.
MAX_ID = MAX_INT32
NO_NUL_PATTERN = r"^[^\x00]*$"  # PostgreSQL text cannot hold NUL characters
# Control characters (C0, DEL, C1, line and paragraph separators): in a host name or a message they would
# start forged lines in logs and terminals, so free text that reaches the log refuses them.
CONTROL_CHARACTERS = "\x00-\x1f\x7f-\x9f\u2028\u2029"
CONTROL_CHARACTER_RE = re.compile(f"[{CONTROL_CHARACTERS}]")


def refuse_control_characters(value: str | None) -> str | None:
    """A field validator: ``value`` unchanged, or ValueError naming the first control character."""
    found = CONTROL_CHARACTER_RE.search(value) if value else None
    if found:
        raise ValueError(f"control character {found.group()!r} at position {found.start()} is not allowed")
    return value


def without_control_characters(text: str) -> str:
    """``text`` with each run of control characters replaced by one space (a message fit to send)."""
    return CONTROL_CHARACTER_RE.sub(" ", text).strip()


PlainText = Annotated[str, AfterValidator(refuse_control_characters)]
SHA256_PATTERN = r"^[0-9a-f]{64}$"


class ValueEnum(str, Enum):
    """A string enum that reads as its value in messages, on every Python version (the states)."""

    def __str__(self) -> str:
        return str(self.value)


class StrictModel(BaseModel):
    """Base of every request model: unknown fields are an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid")


IMPORT_PATH_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$"


def pattern_in_words(pattern: str, hint: str) -> BeforeValidator:
    """A validator that refuses a string not matching ``pattern`` with ``hint`` and the value, in words.

    Put it after ``Field(pattern=pattern)`` in an ``Annotated`` type: it runs first, so a client reads
    "use package.module:ClassName (got 'x')" instead of a regular expression; the schema keeps the pattern.
    """
    compiled = re.compile(pattern)

    def check(value: Any) -> Any:
        if isinstance(value, str) and not compiled.match(value):
            raise PydanticCustomError(
                "string_pattern_mismatch", f"{hint} (got {{got}})", {"got": repr(value[:100])}
            )
        return value

    return BeforeValidator(check)


ImportPath = Annotated[
    str,
    Field(pattern=IMPORT_PATH_PATTERN),
    pattern_in_words(
        IMPORT_PATH_PATTERN, "use package.module:ClassName, e.g. worker.examples.digits:DigitsModule"
    ),
]


def plain_json(value: dict[str, Any]) -> dict[str, Any]:
    """A field validator: ``value`` unchanged if it is plain JSON, else ValueError."""
    try:  # NaN and Infinity parse in Python but are not JSON: the database and clients would choke
        json.dumps(value, allow_nan=False)
    except ValueError as exc:
        raise ValueError(f"not plain JSON: {exc}") from exc
    return value
