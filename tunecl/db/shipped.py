"""The shipped read-only tuning results: export documents in the repository's ``tuning_db/`` folder.

The folder (``config.get().shipped_db``, env ``TUNECL_SHIPPED_DB``; empty disables it) is read once
per process, lazily, into an in-memory index; it is never written. It is the lookup chain's last step
before the heuristic defaults, so a broken file there is skipped with a warning rather than breaking
every lookup.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from collections.abc import Mapping
from pathlib import Path

from tunecl import config
from tunecl.db.exchange import read_document
from tunecl.db.near import BatchPattern
from tunecl.db.records import Hit, Record, keep_new, servable, to_hit
from tunecl.errors import TuneclError
from tunecl.fingerprint import Fingerprint


@dataclasses.dataclass
class ShippedIndex:
    """Shipped records by (problem key, device key) and by (problem key, device model key)."""

    files: list[Path] = dataclasses.field(default_factory=list)
    by_device: dict[tuple[str, str], list[Record]] = dataclasses.field(default_factory=dict)
    by_model: dict[tuple[str, str], list[Record]] = dataclasses.field(default_factory=dict)

    @staticmethod
    def build(files: list[Path], records: list[Record]) -> ShippedIndex:
        """Index records; under one natural key the better one is kept (the rule of TuningDB.record)."""
        kept: dict[tuple[str, str, str, int, str], Record] = {}
        for record in records:
            if keep_new(kept.get(record.natural_key), record):
                kept[record.natural_key] = record
        index = ShippedIndex(files)
        for record in kept.values():
            index.by_device.setdefault((record.problem, record.device.key), []).append(record)
            index.by_model.setdefault((record.problem, record.device.model_key), []).append(record)
        return index

    def devices(self) -> list[Fingerprint]:
        """The devices the records were measured on, each once, by label and key (as ``TuningDB.devices``)."""
        found = {record.device.key: record.device for records in self.by_device.values() for record in records}
        return sorted(found.values(), key=lambda fp: (fp.label, fp.key))

    def lookup(self, fingerprint: Fingerprint, problem_key: str, versions: Mapping[str, int] | None,
               precisions: frozenset[str]) -> Hit | None:
        """The fastest servable record for this exact device, else for its device model."""
        for table, device in ((self.by_device, fingerprint.key), (self.by_model, fingerprint.model_key)):
            candidates = [r for r in table.get((problem_key, device), ())
                          if servable(r, versions, precisions)]
            if candidates:
                fastest = min(candidates, key=_speed_order)
                return to_hit(fastest, "shipped")
        return None

    def best(self, fingerprint: Fingerprint, problem_key: str, versions: Mapping[str, int] | None,
             precisions: frozenset[str]) -> Hit | None:
        """The fastest servable record for this exact device (model and driver) only."""
        candidates = [r for r in self.by_device.get((problem_key, fingerprint.key), ())
                      if servable(r, versions, precisions)]
        return to_hit(min(candidates, key=_speed_order), "shipped") if candidates else None

    def lookup_near_batch(self, fingerprint: Fingerprint, pattern: BatchPattern,
                          versions: Mapping[str, int] | None, precisions: frozenset[str]) -> list[Hit]:
        """The fastest servable record of each problem ``pattern`` matches, closest batch first: this
        exact device's, then its model's (each record once); see ``TuningDB.lookup_near_batch``."""
        hits: list[Hit] = []
        seen: set[tuple[str, str, str, int, str]] = set()
        for table, device in ((self.by_device, fingerprint.key), (self.by_model, fingerprint.model_key)):
            fastest: dict[str, Record] = {}
            for (key, owner), records in table.items():
                if owner != device or pattern.batch_of(key) is None:
                    continue
                candidates = [r for r in records
                              if servable(r, versions, precisions) and r.natural_key not in seen]
                if candidates:
                    fastest[key] = min(candidates, key=_speed_order)
            for key in pattern.rank(fastest):
                seen.add(fastest[key].natural_key)
                hits.append(to_hit(fastest[key], "shipped-near-batch"))
        return hits


def _speed_order(record: Record) -> tuple[float, str, int, str, str]:
    assert record.time_s is not None
    return (record.time_s, record.algorithm, record.algorithm_version, record.precision, record.device.key)


_indexes: dict[Path, ShippedIndex] = {}
_lock = threading.Lock()


def folder() -> Path | None:
    """The configured shipped folder, or None when disabled."""
    value = config.get().shipped_db
    return Path(value).expanduser().resolve() if value else None


def load(path: Path) -> ShippedIndex:
    """Read every ``*.json`` export document in ``path`` (a missing folder is an empty index)."""
    files, records = [], []
    for file in sorted(path.glob("*.json")) if path.is_dir() else []:
        try:
            records.extend(read_document(file))
        except TuneclError as error:
            warnings.warn(f"tunecl: ignoring shipped tuning file {file}: {error}", stacklevel=2)
            continue
        files.append(file)
    return ShippedIndex.build(files, records)


def index() -> ShippedIndex:
    """The index of the configured folder, loaded on first use and kept for the process."""
    path = folder()
    if path is None:
        return ShippedIndex()
    with _lock:  # backend threads may look up concurrently; load once
        if path not in _indexes:
            _indexes[path] = load(path)
        return _indexes[path]


def lookup(fingerprint: Fingerprint, problem_key: str, versions: Mapping[str, int] | None,
           precisions: frozenset[str]) -> Hit | None:
    """The lookup chain's shipped step (see :meth:`ShippedIndex.lookup`)."""
    return index().lookup(fingerprint, problem_key, versions, precisions)


def best(fingerprint: Fingerprint, problem_key: str, versions: Mapping[str, int] | None,
         precisions: frozenset[str]) -> Hit | None:
    """The shipped results' fastest servable record for this exact device (see :meth:`ShippedIndex.best`)."""
    return index().best(fingerprint, problem_key, versions, precisions)


def lookup_near_batch(fingerprint: Fingerprint, pattern: BatchPattern, versions: Mapping[str, int] | None,
                      precisions: frozenset[str]) -> list[Hit]:
    """The near-batch stage's shipped step (see :meth:`ShippedIndex.lookup_near_batch`)."""
    return index().lookup_near_batch(fingerprint, pattern, versions, precisions)


def clear_cache() -> None:
    """Forget loaded indexes (tests that rewrite a shipped folder)."""
    with _lock:
        _indexes.clear()
