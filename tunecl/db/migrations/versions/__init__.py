"""Alembic revisions, one module each (``__init__`` is skipped by Alembic; it makes this a package)."""
