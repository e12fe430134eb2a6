"""Near-batch matching: which stored problems may serve a problem that differs only in its batch.

The backend's second lookup stage (``TuningDB.lookup_near_batch``, used after the exact chain misses)
serves a config tuned for the same problem at another batch. The rule, per kind:

- **conv**: every field equal except ``n``; any stored batch. The batch only scales the GEMM's
  ``n·p·q`` dimension (or the grid), so the tuned tiles, work-group shape and algorithm choice carry
  over.
- **gemm**: every field equal except ``m``, with ``m`` within a factor of :data:`GEMM_MAX_RATIO`.
  The backend's fc layers fold the batch into ``M`` (``x @ W.T`` and ``grad @ W``); unlike a conv's
  ``n·p·q``, ``M`` can be small, where the best tile depends on it, so only a near ``M`` is taken.
  The fc weight gradient has the batch in ``K`` (the reduction length) and is not matched.
- **attention**: every field equal except ``b``; any stored batch. The batch only adds work-groups
  (one grid row per batch and head); the tiles are chosen for the lengths and head dims.

Candidates rank by closeness, ``|log(stored / wanted)|`` compared exactly as the ratio of the larger
batch to the smaller; a tie goes to the larger stored batch. A candidate is only a guess: the caller
still checks that its config applies to and builds for the new problem.

Keys are canonical (``problem_from_key(key).key == key`` for every stored key), so "every other field
equal" is "the same key text around the batch value": a key prefix and suffix that SQL can match with
``LIKE`` and Python with ``startswith``/``endswith``, without parsing keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from fractions import Fraction

from tunecl.problems import AttentionProblem, ConvProblem, GemmProblem, Problem

GEMM_MAX_RATIO = 4  # a GEMM's M may differ by at most this factor either way


@dataclasses.dataclass(frozen=True)
class BatchPattern:
    """The keys of the problems equal to one problem except its batch: ``prefix + <batch> + suffix``.

    Attributes:
        prefix: key text before the batch value (``"conv:n="``, ``"gemm:m="``).
        suffix: key text after it (``",c=64,...,dtype=float32"``).
        batch: the wanted problem's batch.
        max_ratio: the largest accepted ratio between stored and wanted batch; None: any.
    """

    prefix: str
    suffix: str
    batch: int
    max_ratio: int | None = None

    def batch_of(self, key: str) -> int | None:
        """The batch of a stored key that may serve; None for other problems and for the wanted one."""
        if len(key) <= len(self.prefix) + len(self.suffix) or not key.startswith(self.prefix) \
                or not key.endswith(self.suffix):
            return None
        digits = key[len(self.prefix): len(key) - len(self.suffix)]
        if not (digits.isascii() and digits.isdecimal()) or digits.startswith("0"):
            return None
        batch = int(digits)
        if batch == self.batch or (self.max_ratio is not None and self.ratio(batch) > self.max_ratio):
            return None
        return batch

    def ratio(self, batch: int) -> Fraction:
        """``exp(|log(batch / self.batch)|)``, exactly: the larger of the two over the smaller."""
        return Fraction(max(batch, self.batch), min(batch, self.batch))

    def rank(self, keys: Iterable[str]) -> list[str]:
        """The keys that may serve, closest batch first (ties: the larger batch); others dropped."""
        batches = {key: batch for key in keys if (batch := self.batch_of(key)) is not None}
        return sorted(batches, key=lambda key: (self.ratio(batches[key]), -batches[key]))


def batch_pattern(problem: Problem) -> BatchPattern:
    """The :class:`BatchPattern` of ``problem`` (conv: ``n``; gemm: ``m`` within a factor; attention: ``b``)."""
    if isinstance(problem, ConvProblem):
        field, batch, max_ratio = "n", problem.n, None
    elif isinstance(problem, GemmProblem):
        field, batch, max_ratio = "m", problem.m, GEMM_MAX_RATIO
    elif isinstance(problem, AttentionProblem):
        field, batch, max_ratio = "b", problem.batch, None
    else:
        raise TypeError(f"no batch rule for {type(problem).__name__}")
    prefix = f"{problem.kind}:{field}="
    key = problem.key
    digits, comma, rest = key.removeprefix(prefix).partition(",")
    # the batch field leads both keys; fail loudly if the key format ever moves it
    if not key.startswith(prefix) or digits != str(batch) or not comma:
        raise AssertionError(f"{key!r} does not start with {prefix}{batch},")
    return BatchPattern(prefix, "," + rest, batch, max_ratio)
