"""The tuning database: :class:`TuningDB`, a narrow facade over the SQLAlchemy models.

Writes are short transactions. On SQLite the file is in WAL mode (readers never block the writer),
waits up to 30 s for a lock, and every write transaction starts with ``BEGIN IMMEDIATE`` so writers
queue for the lock up front instead of failing when a read transaction tries to become a write one.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import socket
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Self, TypeVar

from sqlalchemy import (
    ColumnElement,
    Engine,
    case,
    create_engine,
    delete,
    event,
    func,
    select,
)
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, joinedload

from tunecl import __version__, config
from tunecl.db import exchange, lookup, schema
from tunecl.db.models import DeviceModel, ProblemModel, ResultModel, utc_now
from tunecl.db.records import (
    OK,
    Hit,
    ImportReport,
    Precisions,
    Record,
    keep_new,
    make_record,
    precision_set,
)
from tunecl.errors import DatabaseError
from tunecl.fingerprint import Fingerprint
from tunecl.problems import Problem, problem_from_key

T = TypeVar("T")
BUSY_TIMEOUT_MS = 30_000
_WRITE_OPTION = "tunecl_sqlite_begin"


def problem_key(problem: Problem | str) -> str:
    """The canonical key of a problem or of a key string (raises ValueError for a bad key)."""
    return problem.key if not isinstance(problem, str) else problem_from_key(problem).key


class TuningDB:
    """A tuning database at one SQLAlchemy URL, opened (created or migrated) on construction.

    Args:
        url: SQLAlchemy URL or plain file path; default ``config.get().db_url`` (``TUNECL_DB``).
        auto_upgrade: migrate an older schema on open; default: only for SQLite (see ``db/schema.py``).

    Raises:
        SchemaVersionError: the DB's schema is newer than this tunecl, or older and not upgradable here.
        DatabaseError: the DB cannot be opened.
    """

    def __init__(self, url: str | None = None, *, auto_upgrade: bool | None = None) -> None:
        raw_url = config.normalize_db_url(url) if url else config.get().db_url
        try:
            self._url: URL = make_url(raw_url)
        except ArgumentError:
            raise DatabaseError(f"not a database URL or file path: {raw_url!r}") from None
        is_sqlite = self._url.get_backend_name() == "sqlite"
        try:
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self.engine: Engine = create_engine(self._url)
        except (OSError, ImportError, SQLAlchemyError) as error:  # no folder, no driver, bad options
            raise DatabaseError(f"cannot open the tuning DB {self.display_url}: {error}") from error
        self._write_engine = self.engine
        if is_sqlite:
            _configure_sqlite(self.engine)
            self._write_engine = self.engine.execution_options(**{_WRITE_OPTION: "IMMEDIATE"})
        try:
            # the revision found on opening (None: created now); `tunecl db upgrade` reports it
            self.opened_at_revision = schema.ensure_schema(
                self.engine, self._write_engine, is_sqlite if auto_upgrade is None else auto_upgrade)
            if self.path is not None:
                _enable_wal(self.engine)
        except SQLAlchemyError as error:
            self.engine.dispose()
            raise DatabaseError(f"cannot open the tuning DB {self.display_url}: {_reason(error)}") from error
        except BaseException:
            self.engine.dispose()
            raise

    # -- identity -----------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The SQLAlchemy URL (with password, if any)."""
        return self._url.render_as_string(hide_password=False)

    @property
    def display_url(self) -> str:
        """The file path for SQLite files, else the URL with its password hidden."""
        return str(self.path) if self.path is not None else self._url.render_as_string(hide_password=True)

    @property
    def path(self) -> Path | None:
        """The file of a SQLite DB; None for in-memory SQLite and server databases."""
        return sqlite_path(self._url)

    def close(self) -> None:
        """Close all pooled connections (SQLite then checkpoints its WAL into the file)."""
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TuningDB({self.display_url!r})"

    # -- sessions -----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def session_scope(self, write: bool = False) -> Iterator[Session]:
        """A session that commits on success, rolls back on error and always closes.

        Args:
            write: take the write lock when the transaction starts (SQLite ``BEGIN IMMEDIATE``).

        Raises:
            DatabaseError: for any SQLAlchemy error, with the driver's one-line reason.
        """
        session = Session(bind=self._write_engine if write else self.engine, expire_on_commit=False)
        try:
            yield session
            session.commit()
        except SQLAlchemyError as error:
            session.rollback()
            raise DatabaseError(f"tuning DB {self.display_url}: {_reason(error)}") from error
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def _write(self, work: Callable[[Session], T]) -> T:
        # Writers only race on a server DB: SQLite's BEGIN IMMEDIATE serializes them, but on PostgreSQL
        # or MySQL two processes can both miss a device/problem/result row and both insert it. The
        # loser gets an IntegrityError on the unique key; a retry sees the winner's row. Bounded: a
        # persistent IntegrityError is a real error.
        attempts = 3
        for attempt in range(attempts):
            try:
                with self.session_scope(write=True) as session:
                    return work(session)
            except DatabaseError as error:
                if not isinstance(error.__cause__, IntegrityError) or attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    # -- writing ------------------------------------------------------------------------------------

    def record(self, fingerprint: Fingerprint, problem: Problem | str, algorithm: str, algorithm_version: int,
               params: Mapping[str, Any], time_s: float | None, default_time_s: float | None = None,
               trials: int = 0, status: str = OK, precision: str = "fp32", origin: str | None = None) -> None:
        """Store one result, keeping the better one under its natural key.

        The natural key is (device, problem, algorithm, algorithm_version, precision). An ok result
        replaces a failed one or a slower ok one; a failed result never replaces an ok one.

        Args:
            fingerprint: the device that measured it.
            problem: the problem (or its key).
            algorithm: kernel family variant name.
            algorithm_version: its current version.
            params: the configuration (JSON-serializable, string keys).
            time_s: median time of ``params`` in seconds; required (> 0) for an ok result, may be None
                for a failed one.
            default_time_s: median time of the algorithm's default config, when measured.
            trials: how many configurations the search evaluated.
            status: ``"ok"`` for a verified result, else ``"failed:<reason>"``.
            precision: ``"fp32"`` (strict), ``"tf32"``, ``"fp16"``, ...
            origin: provenance; default ``"tuned on <hostname>"``.

        Raises:
            ValueError: an argument is out of range (a bug in the caller, not a DB problem).
            DatabaseError: the write failed.
        """
        new = make_record(fingerprint, problem_key(problem), algorithm, algorithm_version, params, time_s,
                          default_time_s, trials, status, precision, utc_now(),
                          origin or f"tuned on {socket.gethostname()}", __version__)
        self._write(lambda session: _Upserter(session).upsert(new))

    def merge(self, records: Iterable[Record], dry_run: bool = False) -> ImportReport:
        """Merge validated records in one transaction with the rule of :meth:`record`.

        Args:
            records: records to merge (see ``exchange.read_document``).
            dry_run: count what would change, write nothing.
        """
        records = list(records)

        def work(session: Session) -> ImportReport:
            upserter = _Upserter(session)
            counts = Counter(upserter.upsert(r) for r in records)
            if dry_run:
                session.rollback()
            return ImportReport(counts["added"], counts["updated"], counts["skipped"], dry_run)

        return self._write(work)

    def prune(self, older_than: dt.datetime | None = None, failed_only: bool = False,
              dry_run: bool = False) -> int:
        """Remove results created before ``older_than`` and/or failed results; returns how many.

        Both criteria given means results that match both. Devices and problems left without
        results are removed too.

        Raises:
            ValueError: neither criterion given (that would remove everything).
        """
        if older_than is None and not failed_only:
            raise ValueError("prune needs older_than and/or failed_only")
        conditions: list[ColumnElement[bool]] = []
        if older_than is not None:
            if older_than.tzinfo is None:
                raise ValueError("older_than must be time-zone aware")
            conditions.append(ResultModel.created_at < older_than)
        if failed_only:
            conditions.append(ResultModel.status != OK)

        if dry_run:
            with self.session_scope() as session:
                return session.scalar(select(func.count(ResultModel.id)).where(*conditions)) or 0

        def work(session: Session) -> int:
            result = session.execute(delete(ResultModel).where(*conditions))
            removed = result.rowcount  # type: ignore[attr-defined]
            if removed:
                session.execute(delete(DeviceModel).where(~DeviceModel.results.any()))
                session.execute(delete(ProblemModel).where(~ProblemModel.results.any()))
            return int(removed)

        return self._write(work)

    # -- reading ------------------------------------------------------------------------------------

    def best(self, fingerprint: Fingerprint, problem: Problem | str,
             versions: Mapping[str, int] | None = None, precision: Precisions = "fp32") -> Hit | None:
        """The fastest servable result for exactly this device (and driver), or None.

        Args:
            fingerprint: the device.
            problem: the problem (or its key).
            versions: algorithm -> current version; when given, only those algorithms at those
                versions count (an empty dict matches nothing).
            precision: the accepted precision, or several (``("fp32", "tf32")``); results of other
                precisions are never served, so a strict fp32 request never gets a tf32 result.
        """
        with self.session_scope() as session:
            return lookup.best(session, fingerprint, problem_key(problem), versions, precision_set(precision))

    def best_or_shipped(self, fingerprint: Fingerprint, problem: Problem | str,
                        versions: Mapping[str, int] | None = None, precision: Precisions = "fp32") -> Hit | None:
        """:meth:`best`, else the shipped results' fastest for exactly this device (model and driver):
        what counts as "already tuned on this device" (other drivers' results do not)."""
        with self.session_scope() as session:
            return lookup.best_or_shipped(session, fingerprint, problem_key(problem), versions,
                                          precision_set(precision))

    def lookup(self, fingerprint: Fingerprint, problem: Problem | str,
               versions: Mapping[str, int] | None = None, precision: Precisions = "fp32") -> Hit | None:
        """The result to run, following the lookup chain (:mod:`tunecl.db.lookup`); None means "use the
        heuristic default". ``versions`` and ``precision`` filter every step as in :meth:`best`."""
        with self.session_scope() as session:
            return lookup.lookup(session, fingerprint, problem_key(problem), versions, precision_set(precision))

    def lookup_near_batch(self, fingerprint: Fingerprint, problem: Problem | str,
                          versions: Mapping[str, int] | None = None,
                          precision: Precisions = "fp32") -> list[Hit]:
        """Results of the same problem at another batch, to try in order when :meth:`lookup` misses
        (:func:`tunecl.db.lookup.lookup_near_batch`). Empty: nothing near."""
        wanted = problem_from_key(problem) if isinstance(problem, str) else problem
        with self.session_scope() as session:
            return lookup.lookup_near_batch(session, fingerprint, wanted, versions, precision_set(precision))

    def results(self, fingerprint: Fingerprint | None = None, problem: Problem | str | None = None, *,
                same_model: bool = False, problem_contains: str | None = None,
                ok_only: bool = False, model_keys: Iterable[str] | None = None) -> list[Record]:
        """Stored results, ordered by device label, device, problem, algorithm, version, precision.

        Args:
            fingerprint: only this device (``same_model``: any driver of its model).
            problem: only this problem.
            same_model: widen ``fingerprint`` to its device model.
            problem_contains: only problems whose key contains this text.
            ok_only: leave out failed results.
            model_keys: only devices of these models (``Fingerprint.model_key``), any driver.
        """
        stmt = select(ResultModel).join(ResultModel.device).join(ResultModel.problem).options(
            joinedload(ResultModel.device), joinedload(ResultModel.problem))
        if fingerprint is not None:
            stmt = stmt.where(DeviceModel.model_key == fingerprint.model_key if same_model
                              else DeviceModel.key == fingerprint.key)
        if model_keys is not None:
            stmt = stmt.where(DeviceModel.model_key.in_(sorted(set(model_keys))))
        if problem is not None:
            stmt = stmt.where(ProblemModel.key == problem_key(problem))
        if problem_contains:
            stmt = stmt.where(ProblemModel.key.contains(problem_contains, autoescape=True))
        if ok_only:
            stmt = stmt.where(ResultModel.status == OK)
        stmt = stmt.order_by(DeviceModel.label, DeviceModel.key, ProblemModel.key, ResultModel.algorithm,
                             ResultModel.algorithm_version, ResultModel.precision)
        with self.session_scope() as session:
            return [lookup.to_record(row) for row in session.scalars(stmt)]

    def devices(self) -> list[Fingerprint]:
        """The devices stored in the DB (each with results: prune removes those left without), by label and key."""
        with self.session_scope() as session:
            stored = session.scalars(select(DeviceModel.fingerprint)
                                     .order_by(DeviceModel.label, DeviceModel.key)).all()
        return [Fingerprint.from_dict(data) for data in stored]

    def stats(self) -> dict[str, Any]:
        """Counts of devices, problems and results (ok / failed), overall and per device."""
        failed = func.sum(case((ResultModel.status != OK, 1), else_=0))
        with self.session_scope() as session:
            per_device = session.execute(
                select(DeviceModel.label, DeviceModel.key, func.count(ResultModel.id), failed,
                       func.count(func.distinct(ResultModel.problem_id)))
                .join(ResultModel.device).group_by(DeviceModel.id)
                .order_by(DeviceModel.label, DeviceModel.key)).all()
            devices = session.scalar(select(func.count(DeviceModel.id))) or 0
            problems = session.scalar(select(func.count(ProblemModel.id))) or 0
        rows = [{"device": label, "key": key, "results": n, "ok": n - (bad or 0), "failed": bad or 0,
                 "problems": n_problems} for label, key, n, bad, n_problems in per_device]
        total = sum(r["results"] for r in rows)
        bad_total = sum(r["failed"] for r in rows)
        return {"url": self.display_url, "schema_revision": schema.head_revision(), "devices": devices,
                "problems": problems, "results": total, "ok": total - bad_total, "failed": bad_total,
                "per_device": rows}

    # -- exchange -----------------------------------------------------------------------------------

    def export(self, fingerprint: Fingerprint | None = None, *,
               model_keys: Iterable[str] | None = None) -> dict[str, Any]:
        """The export document of all ok results (of ``fingerprint``'s device model, and of the device
        models ``model_keys``, when given)."""
        return exchange.export_document(self, fingerprint, model_keys=model_keys)

    def import_(self, source: str | os.PathLike[str], dry_run: bool = False) -> ImportReport:
        """Validate the export document at ``source`` completely, then merge it in one transaction."""
        return exchange.import_document(self, source, dry_run=dry_run)


class _Upserter:
    """Inserts or replaces records in one session, caching device and problem ids."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.devices: dict[str, int] = {}
        self.problems: dict[str, int] = {}

    def upsert(self, new: Record) -> str:
        """Apply :func:`keep_new`; returns ``"added"``, ``"updated"`` or ``"skipped"``."""
        device_id, problem_id = self._device_id(new.device), self._problem_id(new.problem)
        row = self.session.scalar(select(ResultModel).where(
            ResultModel.device_id == device_id, ResultModel.problem_id == problem_id,
            ResultModel.algorithm == new.algorithm, ResultModel.algorithm_version == new.algorithm_version,
            ResultModel.precision == new.precision))
        old = None if row is None else lookup.to_record(row, new.device, new.problem)
        if not keep_new(old, new):
            return "skipped"
        if row is None:
            row = ResultModel(device_id=device_id, problem_id=problem_id, algorithm=new.algorithm,
                              algorithm_version=new.algorithm_version, precision=new.precision)
            self.session.add(row)
        for name in ("params", "status", "time_s", "default_time_s", "trials", "tunecl_version", "origin"):
            setattr(row, name, getattr(new, name))
        row.created_at = new.created_at or utc_now()
        self.session.flush()
        return "added" if old is None else "updated"

    def _device_id(self, fingerprint: Fingerprint) -> int:
        key = fingerprint.key
        if key not in self.devices:
            found = self.session.scalar(select(DeviceModel.id).where(DeviceModel.key == key))
            if found is None:
                device = DeviceModel(key=key, model_key=fingerprint.model_key,
                                     fingerprint=fingerprint.to_dict(), label=fingerprint.label)
                self.session.add(device)
                self.session.flush()
                found = device.id
            self.devices[key] = found
        return self.devices[key]

    def _problem_id(self, key: str) -> int:
        if key not in self.problems:
            found = self.session.scalar(select(ProblemModel.id).where(ProblemModel.key == key))
            if found is None:
                problem = ProblemModel(key=key, kind=key.partition(":")[0])
                self.session.add(problem)
                self.session.flush()
                found = problem.id
            self.problems[key] = found
        return self.problems[key]


def sqlite_path(url: URL) -> Path | None:
    """The file of a SQLite URL; None for other backends and in-memory databases."""
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database or ""
    if database in ("", ":memory:") or url.query.get("mode") == "memory":
        return None
    database = database.removeprefix("file:")
    return Path(database)


def _configure_sqlite(engine: Engine) -> None:
    # The pysqlite recipe from SQLAlchemy's docs: the driver must not emit BEGIN itself (it would
    # start deferred transactions and commit around DDL), so SQLAlchemy emits BEGIN and we choose
    # the kind: IMMEDIATE for write sessions (engine option set by TuningDB), deferred for reads.
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA synchronous = NORMAL")  # safe with WAL; no fsync per commit
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        mode = connection.get_execution_options().get(_WRITE_OPTION, "DEFERRED")
        connection.exec_driver_sql(f"BEGIN {mode}")


def _enable_wal(engine: Engine) -> None:
    # Only once the schema is known to be usable: switching rewrites the file header, and a DB this
    # tunecl refuses (newer schema) must stay byte-identical. The mode is stored in the file, so this
    # is a no-op after the first time. It cannot run inside a transaction, hence the raw connection
    # (pysqlite's own BEGIN is off, see _configure_sqlite).
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.close()
    finally:
        raw.close()


def _reason(error: SQLAlchemyError) -> str:
    """The driver's one-line message rather than SQLAlchemy's multi-line one with the SQL."""
    original = getattr(error, "orig", None)
    text = str(original) if original is not None else str(error)
    return " ".join(text.split()) or type(error).__name__


_shared: dict[tuple[int, str], TuningDB] = {}


def open_db(url: str | None = None) -> TuningDB:
    """A TuningDB shared by this process per URL (default: the configured one), for the backend.

    A forked child gets its own (pooled connections must not cross a fork).
    """
    resolved = config.normalize_db_url(url) if url else config.get().db_url
    key = (os.getpid(), resolved)
    if key not in _shared:
        _shared[key] = TuningDB(resolved)
    return _shared[key]
