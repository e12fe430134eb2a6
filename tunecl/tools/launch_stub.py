"""Kernel launches that reach no driver: what a benchmark uses to time the backend's own Python.

With :func:`stub_launches` in effect, every ``enqueue_nd_range_kernel`` (pyopencl's function and its
binding, which the backend's pre-built launches call) returns at once without enqueueing anything, so
a step's host time is the backend's Python alone; results are garbage. Call it before ``tunecl.backend``
binds the launch functions (before the first op).
"""

from __future__ import annotations


def stub_launches() -> None:
    """Replace pyopencl's kernel enqueue, for the rest of the process, by a function that does nothing."""
    import pyopencl as cl
    import pyopencl._cl as binding

    def stub(*_: object, **__: object) -> None:
        return None

    binding.enqueue_nd_range_kernel = cl.enqueue_nd_range_kernel = stub
