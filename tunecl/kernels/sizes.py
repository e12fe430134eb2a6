"""Integer size arithmetic the kernel families share: divisions rounded up, multiples and powers of two."""

from __future__ import annotations


def ceil_div(a: int, b: int) -> int:
    """``a / b`` rounded up (``b > 0``)."""
    return -(-a // b)


def round_up(n: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` (> 0) that is >= ``n``."""
    return (n + multiple - 1) // multiple * multiple


def next_pow2(a: int) -> int:
    """The smallest power of two >= ``a`` (``a`` >= 1)."""
    return 1 << max(0, int(a - 1).bit_length())
