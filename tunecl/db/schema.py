"""The schema revision of a tuning DB: check it on open, create new DBs, run Alembic migrations.

The rule, applied every time a DB is opened:

* no tunecl tables at all (a new or empty file, or a shared server DB without them) → create the
  schema at the newest revision, on any backend;
* at the newest revision → nothing to do;
* an older revision → migrate automatically if the DB is SQLite (a file the user owns, used by one
  version of tunecl); any other backend may be shared with older tunecl installs, so it raises
  :class:`SchemaVersionError` asking to run ``tunecl db upgrade`` deliberately;
* a revision this tunecl does not know (a newer tunecl wrote it) → :class:`SchemaVersionError` naming
  both revisions; nothing is changed;
* tunecl tables but no revision → :class:`SchemaVersionError`; guessing could damage tuning data.

Alembic is configured in code (no ``alembic.ini``); its version table is ``tunecl_alembic_version`` so
that a database shared with Optuna's storage (which has its own ``alembic_version``) works.
"""

from __future__ import annotations

import functools
from pathlib import Path

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, inspect
from sqlalchemy.exc import SQLAlchemyError

from tunecl.errors import DatabaseError, SchemaVersionError

VERSION_TABLE = "tunecl_alembic_version"
TABLES = frozenset({"tunecl_devices", "tunecl_problems", "tunecl_results"})
# a module attribute rather than a constant in the functions, so tests can point it at a copy
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def alembic_config(connection: Connection | None = None) -> AlembicConfig:
    """An Alembic configuration for tunecl's migrations, bound to ``connection`` when given."""
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


@functools.lru_cache(maxsize=4)
def _script(location: str) -> ScriptDirectory:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", location)
    return ScriptDirectory.from_config(cfg)


def head_revision() -> str:
    """The newest schema revision this tunecl knows."""
    head = _script(str(MIGRATIONS_DIR)).get_current_head()
    assert head is not None, "tunecl migrations have no revision"
    return head


def known_revisions() -> set[str]:
    return {script.revision for script in _script(str(MIGRATIONS_DIR)).walk_revisions()}


def current_revision(connection: Connection) -> str | None:
    """The revision stamped in the DB, or None if it was never stamped."""
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def _state(connection: Connection) -> tuple[str | None, bool]:
    tables = set(inspect(connection).get_table_names())
    return current_revision(connection), bool(tables & TABLES)


def _describe(url: str) -> str:
    return url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else url


def _check_known(revision: str | None, has_tables: bool, where: str) -> None:
    """Raise for the two states no tunecl may touch: a newer revision and unstamped tunecl tables."""
    head = head_revision()
    if revision is not None and revision not in known_revisions():
        raise SchemaVersionError(
            f"the tuning DB {where} has schema revision {revision}, newer than revision {head} that this "
            f"tunecl knows; upgrade tunecl, or point TUNECL_DB at another file")
    if revision is None and has_tables:
        raise SchemaVersionError(
            f"the tuning DB {where} has tunecl tables but no schema revision ({VERSION_TABLE} is missing); "
            "it was not made by tunecl or is damaged: move it aside and start a new one")


def ensure_schema(engine: Engine, write_engine: Engine, auto_upgrade: bool) -> str | None:
    """Make the DB usable at the head revision, following the rule in this module's docstring.

    Args:
        engine: engine for reading the current state (no write lock).
        write_engine: engine whose transactions take the write lock (SQLite ``BEGIN IMMEDIATE``).
        auto_upgrade: whether an older revision may be migrated without asking.

    Returns:
        The revision the DB had when opened (None: it was new).
    """
    where = _describe(engine.url.render_as_string(hide_password=True))
    with engine.connect() as connection:
        revision, has_tables = _state(connection)
    head = head_revision()
    if revision == head:
        return revision
    _check_known(revision, has_tables, where)
    if revision is not None and not auto_upgrade:
        raise SchemaVersionError(
            f"the tuning DB {where} has schema revision {revision}, this tunecl needs revision {head}: "
            "run `tunecl db upgrade`")
    return upgrade(write_engine)[0]


def upgrade(write_engine: Engine) -> tuple[str | None, str]:
    """Migrate the DB to the head revision in one write transaction.

    Returns:
        The revision before (None for a new DB) and the revision now.
    """
    where = _describe(write_engine.url.render_as_string(hide_password=True))
    try:
        return _upgrade_once(write_engine, where)
    except SchemaVersionError:
        raise
    except SQLAlchemyError as error:
        # Several processes may create a new server DB at once; the loser's CREATE TABLE fails on
        # backends without a lock like SQLite's BEGIN IMMEDIATE. If the winner got us to head, fine.
        with write_engine.connect() as connection:
            revision, _ = _state(connection)
        if revision == head_revision():
            return revision, revision
        raise DatabaseError(f"could not migrate the tuning DB {where}: {error}") from error


def _upgrade_once(write_engine: Engine, where: str) -> tuple[str | None, str]:
    with write_engine.connect() as connection:
        sqlite = connection.dialect.name == "sqlite"
        # Alembic's batch mode changes a SQLite table by copy, drop and rename; with foreign keys on,
        # dropping tunecl_devices or tunecl_problems would cascade-delete every result. The pragma is
        # ignored inside a transaction, so it is set on the driver connection before ours begins.
        if sqlite:
            connection.connection.driver_connection.execute("PRAGMA foreign_keys = OFF")
        try:
            with connection.begin():
                # checked again under the write lock: another process may have migrated meanwhile
                before, has_tables = _state(connection)
                _check_known(before, has_tables, where)
                head = head_revision()
                if before != head:
                    command.upgrade(alembic_config(connection), "head")
        finally:
            if sqlite:
                connection.connection.driver_connection.execute("PRAGMA foreign_keys = ON")
    return before, head
