"""Kernel launches that reach no driver: what a benchmark uses to time the backend's own Python.

With :func:`stub_launches` in effect, every ``enqueue_nd_range_kernel`` (pyopencl's function and its
binding, which the backend's pre-built launches call) returns at once without enqueueing anything, so
a step's host time is the backend's Python alone; results are garbage. Call it before ``tunecl.backend``
binds the launch functions (before the first op).
"""

from __future__ import annotations

from collections import Counter

active = False   # whether stub_launches() is in effect (probes whose launches it would drop read it)


def stub_launches(counts: Counter[str] | None = None) -> None:
    """Replace pyopencl's kernel enqueue, for the rest of the process, by a function that does nothing;
    with ``counts``, one that adds one to ``counts[kernel name]`` per launch."""
    import pyopencl as cl
    import pyopencl._cl as binding

    def stub(*_: object, **__: object) -> None:
        return None

    def counting(queue: object, kernel: object, *_: object, **__: object) -> None:
        counts[getattr(kernel, "function_name", "?")] += 1

    binding.enqueue_nd_range_kernel = cl.enqueue_nd_range_kernel = stub if counts is None else counting
    global active
    active = True
