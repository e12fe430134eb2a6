"""Alembic migrations of the tuning database (configured in code by ``tunecl.db.schema``)."""
