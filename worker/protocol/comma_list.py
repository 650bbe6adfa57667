"""``CommaList``: a list of strings written ``a, b`` in an environment variable or a flag.

The settings of both sides use it (``worker/agent/config.py``, ``orchestrator/config.py``, the ec2
launcher's settings). Blanks around items and empty items are dropped; a list given in Python is kept
as it is. ``NoDecode`` keeps pydantic-settings from reading the variable as JSON first.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator
from pydantic_settings import NoDecode


def split_commas(value: Any) -> Any:
    """``"a, b,"`` -> ``["a", "b"]``; anything but a string unchanged."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


CommaList = Annotated[list[str], NoDecode, BeforeValidator(split_commas)]
