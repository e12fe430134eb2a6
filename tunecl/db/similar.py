"""The stored results of problems like one about to be tuned: the configs its search starts from.

A net's problems come in families: the same convolution at another batch or image size, the same
layer shape with more channels, a GEMM whose M is another batch. The tile shapes and algorithms that
won for one member are good first guesses for the next, so ``tunecl tune`` evaluates the winners of
the most similar problems already stored for this device model (user DB and shipped results) right
after the defaults; the sampler then starts from a good best instead of finding it again.

Two problems are comparable when they share what decides which kernels apply and how their tiles map:

- **conv**: direction, dtype, kernel size, stride, padding, dilation, and whether it is depthwise
  (``groups == c == k``), grouped or dense;
- **gemm**: the transposes and the dtype;
- **attention**: direction, dtype, head dims, mask kind and causality.

Among comparable problems the distance is the sum of ``|log(a / b)|`` over the sizes (conv: n, c, k and
the input's h·w; gemm: m, n, k and batch; attention: batch, heads and the two lengths), so doubling any one size is one step of ``log 2``. Only the
stored records' configs are used, never their times: the candidate is measured and verified on the new
problem like any other.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

from tunecl.db import shipped
from tunecl.db.records import Record
from tunecl.fingerprint import Fingerprint
from tunecl.problems import AttentionProblem, ConvProblem, GemmProblem, Problem, problem_from_key

Config = dict[str, Any]


def _shape_class(problem: Problem) -> tuple[Any, ...]:
    """What two problems must share to be compared."""
    if isinstance(problem, ConvProblem):
        grouping = ("depthwise" if problem.groups == problem.c == problem.k
                    else "grouped" if problem.groups > 1 else "dense")
        return ("conv", problem.direction, problem.dtype, problem.r, problem.s, problem.stride, problem.padding,
                problem.dilation, grouping)
    if isinstance(problem, GemmProblem):
        return ("gemm", problem.trans_a, problem.trans_b, problem.dtype)
    if isinstance(problem, AttentionProblem):
        return ("attention", problem.direction, problem.dtype, problem.e, problem.ev, problem.mask, problem.causal)
    return (problem.kind,)


def _sizes(problem: Problem) -> tuple[int, ...]:
    if isinstance(problem, ConvProblem):
        return (problem.n, problem.c, problem.k, problem.h * problem.w)
    if isinstance(problem, GemmProblem):
        return (problem.m, problem.n, problem.k, problem.batch)
    if isinstance(problem, AttentionProblem):
        return (problem.batch, problem.heads, problem.l, problem.s)
    return ()


def distance(a: Problem, b: Problem) -> float | None:
    """How far apart two problems are (0: the same sizes); None when they are not comparable."""
    if _shape_class(a) != _shape_class(b):
        return None
    return sum(abs(math.log(x / y)) for x, y in zip(_sizes(a), _sizes(b), strict=True))


def nearest_configs(records: Iterable[Record], problem: Problem, limit: int) -> list[tuple[str, Config]]:
    """Up to ``limit`` distinct (algorithm, config) pairs from the ok ``records`` of other problems,
    nearest problem first and, within a problem, fastest first."""
    if limit < 1:
        return []
    by_problem: dict[str, list[Record]] = {}
    for record in records:
        if record.ok and record.time_s is not None and record.problem != problem.key:
            by_problem.setdefault(record.problem, []).append(record)
    ranked = []
    for key, rows in by_problem.items():
        try:
            other = problem_from_key(key)
        except ValueError:   # a key this version cannot read: not a hint
            continue
        far = distance(problem, other)
        if far is not None:
            ranked.append((far, key, rows))
    ranked.sort(key=lambda item: (item[0], item[1]))
    configs: list[tuple[str, Config]] = []
    seen: set[tuple[str, tuple[tuple[str, Any], ...]]] = set()
    for _, _, rows in ranked:
        for record in sorted(rows, key=lambda r: (r.time_s, r.algorithm)):
            mark = (record.algorithm, tuple(sorted(record.params.items())))
            if mark not in seen:
                seen.add(mark)
                configs.append((record.algorithm, dict(record.params)))
                if len(configs) == limit:
                    return configs
    return configs


def _shipped_records(fingerprint: Fingerprint) -> Iterator[Record]:
    for (_, model), records in shipped.index().by_model.items():
        if model == fingerprint.model_key:
            yield from records


def similar_configs(db: Any, fingerprint: Fingerprint, problem: Problem, limit: int) -> list[tuple[str, Config]]:
    """The configs to start tuning ``problem`` from: :func:`nearest_configs` over the stored results of
    this device model, the user DB's (``db``, a :class:`~tunecl.db.TuningDB`) and the shipped ones."""
    if limit < 1:
        return []
    stored = db.results(fingerprint, same_model=True, ok_only=True, problem_contains=f"{problem.kind}:")
    return nearest_configs([*stored, *_shipped_records(fingerprint)], problem, limit)
