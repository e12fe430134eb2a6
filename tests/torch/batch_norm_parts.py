"""Batch norm with its channels split into a forced number of parts, for the tests of its launches."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tunecl.backend import state


@contextlib.contextmanager
def forced_parts(parts: int | None) -> Iterator[Any]:
    """The backend's BatchNorm with P (work-groups per channel) forced to ``parts`` (None: its heuristic) for
    the block, its kept launch plans dropped before and after (they depend on P and the module constants
    a test may change)."""
    norm = state.get().norm
    old = norm.force_parts
    norm.force_parts = parts
    norm.forget_launches()
    try:
        yield norm
    finally:
        norm.force_parts = old
        norm.forget_launches()
