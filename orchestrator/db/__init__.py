"""Persistence: ``models`` (tables), ``session`` (engine, sessions, migrations), ``migrations/`` (alembic)."""
