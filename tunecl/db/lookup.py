"""The lookup chain: which stored result a problem runs with, or None for the heuristic default.

The chain, each step filtered by the accepted algorithm versions and precisions:

1. the user DB, this exact device (and driver): source ``user``;
2. the user DB, the same device model on another driver: ``user-other-driver``;
3. the shipped read-only results (:mod:`tunecl.db.shipped`), exact device, then same model: ``shipped``;
4. None: the caller uses the algorithm's heuristic default.

Within a step the fastest servable result wins (ok, timed, an accepted precision and version).
:func:`lookup_near_batch` walks the same steps for the same problem at other batches, closest first,
for a caller whose :func:`lookup` missed. Each function reads through a session the caller holds
(:meth:`tunecl.db.store.TuningDB.session_scope`).
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import ColumnElement, Select, and_, or_, select
from sqlalchemy.orm import Session, joinedload

from tunecl.db import near, shipped
from tunecl.db.models import DeviceModel, ProblemModel, ResultModel
from tunecl.db.records import OK, Hit, Record, to_hit
from tunecl.fingerprint import Fingerprint
from tunecl.problems import Problem


def best(session: Session, fingerprint: Fingerprint, key: str, versions: Mapping[str, int] | None,
         precisions: frozenset[str]) -> Hit | None:
    """The user DB's fastest servable result of problem ``key`` for exactly this device (and driver)."""
    row = _fastest(session, DeviceModel.key == fingerprint.key, key, versions, precisions)
    return None if row is None else to_hit(to_record(row), "user")


def best_or_shipped(session: Session, fingerprint: Fingerprint, key: str, versions: Mapping[str, int] | None,
                    precisions: frozenset[str]) -> Hit | None:
    """:func:`best`, else the shipped results' fastest for exactly this device (model and driver)."""
    return best(session, fingerprint, key, versions, precisions) or shipped.best(
        fingerprint, key, versions, precisions)


def lookup(session: Session, fingerprint: Fingerprint, key: str, versions: Mapping[str, int] | None,
           precisions: frozenset[str]) -> Hit | None:
    """The result problem ``key`` runs with on this device, following the chain; None: the default."""
    for condition, source in _user_steps(fingerprint):
        row = _fastest(session, condition, key, versions, precisions)
        if row is not None:
            return to_hit(to_record(row), source)  # type: ignore[arg-type]
    return shipped.lookup(fingerprint, key, versions, precisions)


def lookup_near_batch(session: Session, fingerprint: Fingerprint, problem: Problem,
                      versions: Mapping[str, int] | None, precisions: frozenset[str]) -> list[Hit]:
    """Results of ``problem`` at another batch, to try in order when :func:`lookup` misses.

    The batch rule (conv: any ``n``; gemm: ``m`` within a factor) is :mod:`tunecl.db.near`'s. The
    chain's steps in order, each one's stored problems closest batch first, with one hit per stored
    problem (its fastest servable result); sources are the steps' names with ``-near-batch`` appended
    and ``Hit.problem`` is the stored key. Empty: nothing near. The problem itself is never among them.
    """
    pattern = near.batch_pattern(problem)
    # One pass over the problem keys (LIKE, escaped: keys hold '_'; batch_of then checks the exact text
    # and drops far batches), then the results of the few matches by problem id: ~1 ms on 5,000
    # problems, where joining every result of the device first took ~4 ms.
    like = and_(ProblemModel.key.startswith(pattern.prefix, autoescape=True),
                ProblemModel.key.endswith(pattern.suffix, autoescape=True))
    ids = [id_ for id_, key in session.execute(select(ProblemModel.id, ProblemModel.key).where(like))
           if pattern.batch_of(key) is not None]
    hits: list[Hit] = []
    for condition, source in _user_steps(fingerprint) if ids else ():
        rows = _nearest(session, condition, ids, pattern, versions, precisions)
        hits.extend(to_hit(to_record(row), f"{source}-near-batch")  # type: ignore[arg-type]
                    for row in rows)
    return hits + shipped.lookup_near_batch(fingerprint, pattern, versions, precisions)


def to_record(row: ResultModel, device: Fingerprint | None = None, problem: str | None = None) -> Record:
    """A stored result row as a :class:`Record` (``device``/``problem``: already known, not re-read)."""
    return Record(
        device=device or Fingerprint.from_dict(row.device.fingerprint),
        problem=problem or row.problem.key, algorithm=row.algorithm,
        algorithm_version=row.algorithm_version, params=dict(row.params), time_s=row.time_s,
        default_time_s=row.default_time_s, trials=row.trials, status=row.status, precision=row.precision,
        tunecl_version=row.tunecl_version, created_at=row.created_at, origin=row.origin)


def _user_steps(fingerprint: Fingerprint) -> tuple[tuple[ColumnElement[bool], str], ...]:
    """The user DB's steps of the chain: (device condition, source name)."""
    return ((DeviceModel.key == fingerprint.key, "user"),
            (and_(DeviceModel.model_key == fingerprint.model_key, DeviceModel.key != fingerprint.key),
             "user-other-driver"))


def _servable(device_condition: ColumnElement[bool], problem_condition: ColumnElement[bool],
              versions: Mapping[str, int] | None, precisions: frozenset[str]) -> Select[tuple[ResultModel]]:
    """Servable results (ok, accepted precision, current version), fastest first."""
    stmt = (select(ResultModel).join(ResultModel.device).join(ResultModel.problem)
            .options(joinedload(ResultModel.device), joinedload(ResultModel.problem))
            .where(device_condition, problem_condition, ResultModel.status == OK,
                   ResultModel.time_s.is_not(None), ResultModel.precision.in_(sorted(precisions))))
    if versions is not None:
        stmt = stmt.where(or_(*(and_(ResultModel.algorithm == name, ResultModel.algorithm_version == version)
                                for name, version in versions.items())))
    return stmt.order_by(ResultModel.time_s, ResultModel.algorithm, ResultModel.algorithm_version,
                         ResultModel.precision, DeviceModel.key)


def _fastest(session: Session, device_condition: ColumnElement[bool], key: str,
             versions: Mapping[str, int] | None, precisions: frozenset[str]) -> ResultModel | None:
    if versions is not None and not versions:
        return None
    return session.scalars(_servable(device_condition, ProblemModel.key == key, versions, precisions)
                           .limit(1)).first()


def _nearest(session: Session, device_condition: ColumnElement[bool], problem_ids: list[int],
             pattern: near.BatchPattern, versions: Mapping[str, int] | None,
             precisions: frozenset[str]) -> list[ResultModel]:
    """The fastest servable result of each of ``problem_ids`` (``pattern``'s), closest batch first."""
    if versions is not None and not versions:
        return []
    fastest: dict[str, ResultModel] = {}
    for row in session.scalars(_servable(device_condition, ResultModel.problem_id.in_(problem_ids), versions,
                                         precisions)):
        fastest.setdefault(row.problem.key, row)
    return [fastest[key] for key in pattern.rank(fastest)]
