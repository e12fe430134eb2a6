"""Tensor-core float16 families made to run on any device, for the float16 routes' tests on PoCL: each
applies to every float16 problem of its kind, takes an H200's search space and default, and is built with
its plain-C stand-in of the PTX (``emulate=True``)."""

from __future__ import annotations

import types

from tunecl import runtime

H200 = types.SimpleNamespace(
    local_mem_size=48 * 1024, max_work_group_size=1024, capabilities=frozenset({runtime.MMA_F16}),
    fingerprint=types.SimpleNamespace(vendor="NVIDIA Corporation", device_type="gpu", compute_units=132),
)


def emulated(family: type, problem_type: type) -> type:
    """A subclass of the float16 tensor-core ``family`` that applies to any float16 ``problem_type``
    problem on any device, with an H200's space and default, built emulated."""

    class Emulated(family):
        def applies(self, problem, device):
            return isinstance(problem, problem_type) and problem.dtype == "float16"

        def space(self, problem, device):
            return super().space(problem, H200)

        def default(self, problem, device):
            return super().default(problem, H200)

        def build(self, problem, device, config, *, emulate=True):
            return super().build(problem, device, config, emulate=True)

    Emulated.__name__ = Emulated.__qualname__ = f"Emulated{family.__name__}"
    return Emulated
