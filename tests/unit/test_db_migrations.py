"""Schema revisions: the checked-in DB of revision 0001 opens; unknown, unstamped and older schemas."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import textwrap
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from tunecl.cli import main
from tunecl.db import TuningDB, schema
from tunecl.db.models import Base
from tunecl.errors import SchemaVersionError
from tunecl.problems import problem_from_key

DATA = Path(__file__).resolve().parent.parent / "data"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def v1_db(tmp_path) -> Path:
    """A private copy of the checked-in revision-0001 DB (the original must never change)."""
    path = tmp_path / "tuning_v1.sqlite"
    shutil.copyfile(DATA / "tuning_v1.sqlite", path)
    return path


def test_checked_in_revision_0001_opens_and_reads(v1_db):
    from tunecl.fingerprint import Fingerprint

    with TuningDB(str(v1_db)) as db:
        assert db.opened_at_revision == "0001"
        records = db.results()
        assert [(r.algorithm, r.status, r.time_s) for r in records] == [
            ("conv_im2col", "ok", 0.0105), ("conv_winograd", "failed:wrong result", None),
            ("gemm_tiled", "ok", 0.00125)]
        fingerprint = records[0].device
        assert isinstance(fingerprint, Fingerprint) and fingerprint.device_type == "cpu"
        gemm = problem_from_key("gemm:m=256,n=256,k=256")
        hit = db.lookup(fingerprint, gemm)
        assert hit.params == {"MWG": 64, "NWG": 64, "KWG": 16}
        assert (hit.default_time_s, hit.source) == (0.0025, "user")
        assert records[2].created_at.isoformat() == "2025-01-02T03:04:05+00:00"
        db.record(fingerprint, gemm, "gemm_tiled", 1, {"MWG": 32}, 0.001)  # and it takes new results
        assert db.best(fingerprint, gemm).params == {"MWG": 32}


def test_migrations_build_exactly_the_models(tmp_path):
    with TuningDB(str(tmp_path / "fresh.sqlite")) as db, db.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table": schema.VERSION_TABLE,
                                                               "compare_type": True})
        diffs = [d for d in compare_metadata(context, Base.metadata)
                 if not (d[0] == "remove_table" and d[1].name == schema.VERSION_TABLE)]
        assert diffs == []
        assert schema.current_revision(connection) == schema.head_revision()


def _stamp(path: Path, revision: str | None) -> None:
    with sqlite3.connect(path) as connection:
        if revision is None:
            connection.execute(f"DROP TABLE {schema.VERSION_TABLE}")
        else:
            connection.execute(f"UPDATE {schema.VERSION_TABLE} SET version_num = ?", (revision,))
    connection.close()


def test_a_newer_revision_is_refused_and_left_alone(v1_db, capsys):
    _stamp(v1_db, "9a9a9a9a")
    before = _sha256(v1_db)
    with pytest.raises(SchemaVersionError) as error:
        TuningDB(str(v1_db))
    message = str(error.value)
    assert "9a9a9a9a" in message and schema.head_revision() in message and "upgrade tunecl" in message
    assert main(["db", "stats", "--db", str(v1_db)]) == 1
    assert main(["db", "upgrade", "--db", str(v1_db)]) == 1
    assert "newer than revision" in capsys.readouterr().err
    assert _sha256(v1_db) == before


def test_tunecl_tables_without_a_revision_are_refused(v1_db):
    _stamp(v1_db, None)
    with pytest.raises(SchemaVersionError, match="no schema revision"):
        TuningDB(str(v1_db))


def test_an_empty_file_becomes_a_new_db(tmp_path):
    path = tmp_path / "empty.sqlite"
    path.touch()
    with TuningDB(str(path)) as db:
        assert db.opened_at_revision is None
        assert db.stats()["results"] == 0
    with TuningDB(str(path)) as db:
        assert db.opened_at_revision == schema.head_revision()


def test_a_db_shared_with_another_alembic_user_works(tmp_path):
    path = tmp_path / "shared.sqlite"
    with sqlite3.connect(path) as connection:  # e.g. Optuna's storage, with its own alembic_version
        connection.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        connection.execute("INSERT INTO alembic_version VALUES ('v3.2.0.a')")
    connection.close()
    with TuningDB(str(path)) as db:
        assert db.opened_at_revision is None
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT version_num FROM alembic_version").fetchall() == [("v3.2.0.a",)]
    connection.close()


@pytest.fixture
def second_revision(tmp_path, monkeypatch) -> str:
    """Migrations with a synthetic revision 0002 after 0001, so 0001 files are an *older* schema."""
    copy = tmp_path / "migrations"
    shutil.copytree(schema.MIGRATIONS_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "versions" / "0002_test.py").write_text(textwrap.dedent('''
        import sqlalchemy as sa
        from alembic import op

        revision = "0002"
        down_revision = "0001"
        branch_labels = None
        depends_on = None

        def upgrade():
            op.create_table("tunecl_test_extra", sa.Column("id", sa.Integer(), primary_key=True))
            # a copy-and-drop rebuild of the parent table: must not cascade-delete the results
            with op.batch_alter_table("tunecl_devices", recreate="always") as batch:
                batch.add_column(sa.Column("note", sa.String(64), nullable=True))

        def downgrade():
            op.drop_table("tunecl_test_extra")
    '''))
    monkeypatch.setattr(schema, "MIGRATIONS_DIR", copy)
    return "0002"


def _tables(path: Path) -> set[str]:
    engine = create_engine(f"sqlite:///{path}")
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_an_older_sqlite_db_is_migrated_on_open(v1_db, second_revision):
    with TuningDB(str(v1_db)) as db:
        assert db.opened_at_revision == "0001"
        assert len(db.results()) == 3
    assert "tunecl_test_extra" in _tables(v1_db)
    with TuningDB(str(v1_db)) as db:
        assert db.opened_at_revision == second_revision


def test_an_older_db_without_auto_upgrade_asks_for_tunecl_db_upgrade(v1_db, second_revision, capsys):
    before = _sha256(v1_db)
    with pytest.raises(SchemaVersionError) as error:
        TuningDB(str(v1_db), auto_upgrade=False)  # what a server DB gets
    assert "run `tunecl db upgrade`" in str(error.value)
    assert "0001" in str(error.value) and second_revision in str(error.value)
    assert _sha256(v1_db) == before
    assert main(["db", "upgrade", "--db", str(v1_db)]) == 0
    assert "0001 -> 0002" in capsys.readouterr().out
    with TuningDB(str(v1_db), auto_upgrade=False) as db:
        assert db.opened_at_revision == second_revision
    assert main(["db", "upgrade", "--db", str(v1_db)]) == 0
    assert "already at schema revision 0002" in capsys.readouterr().out


def test_the_checked_in_file_is_untouched():
    # guards against a test opening the original instead of a copy (opening it would switch it to WAL)
    with sqlite3.connect(DATA / "tuning_v1.sqlite") as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    connection.close()
