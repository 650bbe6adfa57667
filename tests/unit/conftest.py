"""Fixtures of the unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.db.session import Database


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    """A fresh SQLite database, migrated to the latest schema, for one test."""
    database = Database(f"sqlite:///{tmp_path / 'unit.db'}")
    database.upgrade()
    try:
        yield database
    finally:
        database.close()
