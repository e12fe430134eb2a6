"""Plain values the DB layer hands out and takes in: :class:`Record` (one stored result) and :class:`Hit`.

Also the rules shared by the SQL store and the shipped in-memory index: which result may be served
(:func:`servable`) and which of two results for one natural key is kept (:func:`keep_new`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from tunecl.fingerprint import Fingerprint

OK = "ok"
Source = Literal["user", "user-other-driver", "shipped",
                 "user-near-batch", "user-other-driver-near-batch", "shipped-near-batch"]
Precisions = str | Iterable[str]


@dataclasses.dataclass(frozen=True)
class Record:
    """One result as stored and exchanged: the best config of an algorithm for a problem on a device.

    The natural key is (device.key, problem, algorithm, algorithm_version, precision).
    """

    device: Fingerprint
    problem: str
    algorithm: str
    algorithm_version: int
    params: dict[str, Any]
    time_s: float | None
    default_time_s: float | None = None
    trials: int = 0
    status: str = OK
    precision: str = "fp32"
    tunecl_version: str = ""
    created_at: dt.datetime | None = None
    origin: str = ""

    @property
    def natural_key(self) -> tuple[str, str, str, int, str]:
        return (self.device.key, self.problem, self.algorithm, self.algorithm_version, self.precision)

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def speedup(self) -> float | None:
        """How many times faster than the algorithm's default config (None if unknown)."""
        if not self.ok or not self.time_s or not self.default_time_s:
            return None
        return self.default_time_s / self.time_s


@dataclasses.dataclass(frozen=True)
class Hit:
    """A servable result found by :meth:`TuningDB.lookup` or :meth:`TuningDB.best`.

    Attributes:
        algorithm: name of the kernel family variant to run.
        algorithm_version: its version when tuned (equal to the one asked for when ``versions`` was given).
        params: the tuned configuration (a fresh dict per hit: changing it changes nothing stored).
        time_s: median time measured for ``params``.
        default_time_s: median time of the algorithm's default config, if measured.
        source: ``"user"`` (this device and driver), ``"user-other-driver"`` (same model, another
            driver) or ``"shipped"`` (the read-only results in ``tuning_db/``); with ``-near-batch``
            appended for a result of the same problem at another batch
            (:meth:`TuningDB.lookup_near_batch`).
        device_label: the label of the device that measured it.
        precision: the precision it was tuned for (``"fp32"``, ``"tf32"``, ``"fp16"``, ...).
        problem: the key of the problem it was tuned for (another batch's for a near-batch hit).
    """

    algorithm: str
    algorithm_version: int
    params: dict[str, Any]
    time_s: float
    default_time_s: float | None
    source: Source
    device_label: str
    precision: str
    problem: str = ""


def precision_set(precision: Precisions) -> frozenset[str]:
    """``"fp32"`` or an iterable of accepted precisions, as a set (a strict request names one)."""
    names = frozenset({precision} if isinstance(precision, str) else precision)
    if not names:
        raise ValueError("at least one precision must be accepted")
    return names


def servable(record: Record, versions: Mapping[str, int] | None, precisions: frozenset[str]) -> bool:
    """Whether ``record`` may answer a request: ok, an accepted precision, and a current version.

    ``versions`` maps algorithm -> its current version; when given, results of other versions and of
    algorithms missing from it are not servable.
    """
    if not record.ok or record.time_s is None or record.precision not in precisions:
        return False
    return versions is None or versions.get(record.algorithm) == record.algorithm_version


def keep_new(old: Record | None, new: Record) -> bool:
    """Whether ``new`` replaces ``old`` under one natural key.

    An ok result beats a failed one, the faster ok result wins (a tie keeps the old one), a failed
    result never replaces an ok one, and a later failure replaces an earlier one (its reason is
    fresher). Ties keep the old record, so importing one document twice changes nothing.
    """
    if old is None:
        return True
    if new.ok and old.ok:
        return new.time_s is not None and (old.time_s is None or new.time_s < old.time_s)
    if new.ok or old.ok:
        return new.ok
    return old.created_at is None or (new.created_at is not None and new.created_at > old.created_at)


def to_hit(record: Record, source: Source) -> Hit:
    assert record.time_s is not None
    return Hit(record.algorithm, record.algorithm_version, dict(record.params), record.time_s,
               record.default_time_s, source, record.device.label, record.precision, record.problem)


@dataclasses.dataclass(frozen=True)
class ImportReport:
    """What merging a set of records did (or would do, for a dry run)."""

    added: int = 0
    updated: int = 0
    skipped: int = 0
    dry_run: bool = False

    def __str__(self) -> str:
        text = f"added {self.added}, updated {self.updated}, skipped {self.skipped}"
        return text + (" (dry run: nothing written)" if self.dry_run else "")


def make_record(fingerprint: Fingerprint, problem: str, algorithm: str, algorithm_version: int,
                params: Mapping[str, Any], time_s: float | None, default_time_s: float | None, trials: int,
                status: str, precision: str, created_at: dt.datetime | None, origin: str,
                tunecl_version: str) -> Record:
    """A validated :class:`Record` (raises ValueError with the reason for out-of-range values)."""
    if not isinstance(algorithm, str) or not 0 < len(algorithm) <= 64:
        raise ValueError(f"algorithm must be a name of 1 to 64 characters, got {algorithm!r}")
    for name, value in (("algorithm_version", algorithm_version), ("trials", trials)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be an integer ≥ 0, got {value!r}")
    if not isinstance(status, str) or not (status == OK or status.startswith("failed")):
        raise ValueError(f"status must be 'ok' or 'failed:<reason>', got {status!r}")
    if not isinstance(precision, str) or not 0 < len(precision) <= 16:
        raise ValueError(f"precision must be a name of 1 to 16 characters, got {precision!r}")
    for name, value in (("time_s", time_s), ("default_time_s", default_time_s)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value <= 0):
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    if status == OK and time_s is None:
        raise ValueError("an ok result needs its time_s")
    if not isinstance(params, Mapping) or not all(isinstance(k, str) for k in params):
        raise ValueError(f"params must be a dict with string keys, got {type(params).__name__}")
    try:
        # stored exactly as JSON gives it back (tuples become lists), so export/import round-trips
        plain = json.loads(json.dumps(dict(params), allow_nan=False))
    except (TypeError, ValueError) as error:
        raise ValueError(f"params must be JSON-serializable: {error}") from None
    # the columns are bounded (server DBs enforce it); a failure reason may be a whole build log
    return Record(fingerprint, problem, algorithm, algorithm_version, plain,
                  None if time_s is None else float(time_s),
                  None if default_time_s is None else float(default_time_s), trials,
                  _clip(status, 512), precision, _clip(tunecl_version, 32), created_at, _clip(origin, 512))


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
