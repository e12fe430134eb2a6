"""A scratch copy of a tuning DB in memory, for what must change nothing on disk (``tunecl db import
--dry-run``).

A SQLite file is copied with SQLite's online backup from a read-only connection into a named in-memory
database; a file that does not exist gives an empty one, so nothing is created either way. The copy is
opened as a :class:`TuningDB` like the file would be (an older schema is migrated, in memory; a newer
one is refused), so a dry run meets every check a real import meets. Other backends are opened as they
are: their writes are rolled back by the caller.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import urllib.parse
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SADeprecationWarning

from tunecl import config
from tunecl.db.store import TuningDB, sqlite_path
from tunecl.errors import DatabaseError


@contextlib.contextmanager
def scratch_copy(url: str | None = None) -> Iterator[TuningDB]:
    """A :class:`TuningDB` holding what the DB at ``url`` (default: the configured one) holds, whose
    writes never reach it (for a SQLite file; see the module's docstring for other backends).

    Raises:
        DatabaseError: the file cannot be read, or the copy cannot be opened (e.g. a newer schema); the
            message names the file, not the copy.
    """
    raw = config.normalize_db_url(url) if url else config.get().db_url
    try:
        path = sqlite_path(make_url(raw))
    except ArgumentError:
        raise DatabaseError(f"not a database URL or file path: {raw!r}") from None
    if path is None:  # a server DB or an in-memory one
        with TuningDB(raw) as db:
            yield db
        return
    name = f"tunecl-scratch-{uuid.uuid4().hex}"
    # the shared in-memory DB lives while a connection to it is open: this one, until the end
    keeper = sqlite3.connect(f"file:{name}?mode=memory&cache=shared", uri=True)
    try:
        if path.is_file():
            _copy(path, keeper)
        try:
            with warnings.catch_warnings():
                # SQLAlchemy picks its pool for a mode=memory URL and warns that a later release picks
                # another: either one shares this named DB between its connections
                warnings.filterwarnings("ignore", "Selection of the SingletonThreadPool", SADeprecationWarning)
                db = TuningDB(f"sqlite:///file:{name}?mode=memory&cache=shared&uri=true")
        except DatabaseError as error:  # named by the file it copies
            copy = re.compile(rf"(sqlite:///)?file(:|%3A){name}(\?[^\s:]*)?")
            raise type(error)(copy.sub(lambda _: str(path), str(error))) from error
        with db:
            yield db
    finally:
        keeper.close()


def _copy(path: Path, target: sqlite3.Connection) -> None:
    """Copy the SQLite file at ``path`` into ``target`` without writing anything beside it.

    Read-only; without a write-ahead log beside it the file is also opened immutable, which keeps
    SQLite from creating the -wal and -shm files that a read of a WAL-mode DB otherwise leaves.
    """
    live = Path(f"{path}-wal").exists()
    uri = f"file:{urllib.parse.quote(str(path))}?mode=ro" + ("" if live else "&immutable=1")
    try:
        source = sqlite3.connect(uri, uri=True)
        try:
            source.backup(target)
        finally:
            source.close()
    except sqlite3.Error as error:
        raise DatabaseError(f"cannot read the tuning DB {path}: {error}") from error
