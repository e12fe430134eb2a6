"""Alembic environment: runs on the connection ``tunecl.db.schema`` hands over, never from a URL.

``schema.upgrade`` opens the (write) transaction itself, so the revision check and the migration happen
under one lock; Alembic sees an external transaction and leaves it alone.
"""

from __future__ import annotations

from alembic import context

from tunecl.db.models import Base
from tunecl.db.schema import VERSION_TABLE

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("tunecl migrations run through tunecl.db.schema (`tunecl db upgrade`), "
                       "not the alembic command")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    version_table=VERSION_TABLE,
    # SQLite cannot ALTER most things: batch mode copies the table instead
    render_as_batch=True,
)
with context.begin_transaction():
    context.run_migrations()
