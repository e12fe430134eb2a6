"""Export and import of tuning results as one versioned JSON document.

The document::

    {"format": "tunecl-db", "version": 1, "exported_at": "<ISO 8601 UTC>", "tunecl_version": "0.1.0",
     "records": [{"device": {<Fingerprint.to_dict()>}, "problem": "<problem key>", "algorithm": "...",
                  "algorithm_version": 1, "params": {...}, "precision": "fp32", "status": "ok",
                  "time_s": 0.001, "default_time_s": 0.002, "trials": 100, "tunecl_version": "0.1.0",
                  "created_at": "<ISO 8601 UTC>", "origin": "tuned on host"}, ...]}

Import validates the whole document before it touches the DB, so a malformed file changes nothing,
then merges every record in one transaction (the rule of ``TuningDB.record``: the faster verified
result wins; provenance travels with each record).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from tunecl import __version__
from tunecl.db.records import ImportReport, Record, make_record
from tunecl.errors import ImportFormatError, TuneclError
from tunecl.fingerprint import Fingerprint
from tunecl.problems import problem_from_key

FORMAT = "tunecl-db"
VERSION = 1
_REQUIRED = ("device", "problem", "algorithm", "algorithm_version", "params", "precision", "status",
             "time_s")


class ResultStore(Protocol):
    """What export and import use of a tuning DB (:class:`tunecl.db.store.TuningDB` has it)."""

    def results(self, fingerprint: Fingerprint | None = None, *, same_model: bool = False,
                ok_only: bool = False, model_keys: Iterable[str] | None = None) -> list[Record]: ...

    def merge(self, records: Iterable[Record], dry_run: bool = False) -> ImportReport: ...


def export_document(db: ResultStore, fingerprint: Fingerprint | None = None, *,
                    model_keys: Iterable[str] | None = None) -> dict[str, Any]:
    """All ok results of ``db`` as an export document, in a deterministic order.

    Args:
        db: the DB to read.
        fingerprint: only results of this device model (every driver version of it), when given.
        model_keys: only results of these device models (``Fingerprint.model_key``), when given.
    """
    records = db.results(fingerprint, same_model=True, ok_only=True, model_keys=model_keys)
    records.sort(key=lambda r: (r.device.key, r.problem, r.algorithm, r.algorithm_version, r.precision))
    return {"format": FORMAT, "version": VERSION,
            "exported_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "tunecl_version": __version__, "records": [record_to_dict(r) for r in records]}


def record_to_dict(record: Record) -> dict[str, Any]:
    """One record in the document's form (keys in the documented order)."""
    return {"device": record.device.to_dict(), "problem": record.problem, "algorithm": record.algorithm,
            "algorithm_version": record.algorithm_version, "params": record.params,
            "precision": record.precision, "status": record.status, "time_s": record.time_s,
            "default_time_s": record.default_time_s, "trials": record.trials,
            "tunecl_version": record.tunecl_version,
            "created_at": None if record.created_at is None else record.created_at.isoformat(),
            "origin": record.origin}


def dumps(document: Mapping[str, Any]) -> str:
    """The document as text: one record per line keeps diffs of ``tuning_db/`` files readable."""
    head = {k: v for k, v in document.items() if k != "records"}
    lines = [json.dumps(r, sort_keys=False, allow_nan=False) for r in document["records"]]
    body = json.dumps(head, indent=1)[:-2]  # without the closing "\n}"
    records = ",\n  ".join(lines)
    return f'{body},\n "records": [\n  {records}\n ]\n}}\n' if lines else f'{body},\n "records": []\n}}\n'


def write_document(document: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write the document to ``path`` atomically (a crash never leaves half a file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(dumps(document), encoding="utf-8")
    os.replace(tmp, path)


def parse_document(text: str | bytes, name: str = "<document>") -> list[Record]:
    """Parse and validate a whole document; returns its records.

    Raises:
        ImportFormatError: one line naming ``name``, the record index where relevant, and the reason.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise ImportFormatError(f"{name}: not a tunecl export (not UTF-8 text)") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        ends_early = error.pos >= len(text.rstrip()) or error.msg.startswith("Unterminated string")
        hint = "; the file ends early: truncated?" if ends_early else ""
        raise ImportFormatError(f"{name}: not valid JSON ({error.msg}: line {error.lineno} column "
                                f"{error.colno}{hint})") from None
    return validate_document(document, name)


def validate_document(document: Any, name: str = "<document>") -> list[Record]:
    """Validate an already-parsed document (see :func:`parse_document`)."""
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        found = document.get("format") if isinstance(document, dict) else type(document).__name__
        raise ImportFormatError(f"{name}: not a tunecl export (format is {found!r}, expected {FORMAT!r})")
    version = document.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ImportFormatError(f"{name}: bad document version {version!r}")
    if version > VERSION:
        raise ImportFormatError(f"{name}: document version {version} is newer than this tunecl reads "
                                f"(up to {VERSION}); upgrade tunecl")
    records = document.get("records")
    if not isinstance(records, list):
        raise ImportFormatError(f"{name}: 'records' must be a list")
    origin = f"imported from {Path(name).name}"
    out = []
    for index, item in enumerate(records):
        try:
            out.append(_record_from_dict(item, origin))
        except (ValueError, TypeError) as error:
            reason = " ".join(str(error).split())
            raise ImportFormatError(f"{name}: record {index}: {reason}") from None
    return out


def _record_from_dict(item: Any, default_origin: str) -> Record:
    if not isinstance(item, dict):
        raise TypeError(f"expected an object, got {type(item).__name__}")
    missing = [field for field in _REQUIRED if field not in item]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    device = item["device"]
    if not isinstance(device, dict):
        raise TypeError("'device' must be an object")
    fingerprint = Fingerprint.from_dict(device)  # ValueError names missing fields
    for field in dataclasses.fields(Fingerprint):
        value = getattr(fingerprint, field.name)
        kind = int if field.type in ("int", int) else str
        if not isinstance(value, kind) or isinstance(value, bool):
            raise TypeError(f"device {field.name} must be {'an integer' if kind is int else 'a string'}")
    problem = item["problem"]
    if not isinstance(problem, str):
        raise TypeError("'problem' must be a problem key string")
    created_at = item.get("created_at")
    if created_at is not None:
        if not isinstance(created_at, str):
            raise TypeError("'created_at' must be an ISO 8601 string")
        created_at = dt.datetime.fromisoformat(created_at)  # ValueError names the bad text
        if created_at.tzinfo is None:
            created_at = created_at.replace(tzinfo=dt.UTC)
    for field in ("origin", "tunecl_version"):
        if not isinstance(item.get(field) or "", str):
            raise TypeError(f"'{field}' must be a string")
    status = item["status"]
    return make_record(
        fingerprint, problem_from_key(problem).key, item["algorithm"],
        item["algorithm_version"], item["params"], item["time_s"], item.get("default_time_s"),
        item.get("trials", 0), status, item["precision"], created_at,
        item.get("origin") or default_origin, item.get("tunecl_version") or "")


def read_document(path: str | os.PathLike[str]) -> list[Record]:
    """Read and validate the export document at ``path``; ``-`` reads standard input.

    Raises:
        ImportFormatError: the document is malformed (one line, with the record index).
        TuneclError: the file cannot be read.
    """
    import sys

    if os.fspath(path) == "-":
        return parse_document(sys.stdin.buffer.read(), "<stdin>")
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise TuneclError(f"cannot read {path}: {error.strerror or error}") from None
    return parse_document(data, str(path))


def import_document(db: ResultStore, source: str | os.PathLike[str] | list[Record], *,
                    dry_run: bool = False) -> ImportReport:
    """Validate a whole export document, then merge it into ``db`` in one transaction.

    Args:
        db: the DB to merge into.
        source: a file path (``-`` for standard input) or records from :func:`read_document`.
        dry_run: report what would change without writing.

    Raises:
        ImportFormatError: the document is malformed; ``db`` is unchanged.
    """
    records = source if isinstance(source, list) else read_document(source)
    return db.merge(records, dry_run=dry_run)

