"""Which verification harness checks which kind of problem: :func:`harness_for` and :data:`HARNESSES`.

The harnesses themselves are in ``harness.py`` (the protocols, GEMM and the helpers every harness uses),
``harness_conv.py`` and ``harness_attention.py``.
"""

from __future__ import annotations

from collections.abc import Callable

from tunecl.problems import Problem
from tunecl.runtime import Device
from tunecl.search.harness import GemmHarness, Harness


def _conv_harness(problem: Problem, device: Device, seed: int = 0) -> Harness:
    from tunecl.search.harness_conv import ConvHarness  # imports torch: only when convs are tuned

    return ConvHarness(problem, device, seed)


def _attention_harness(problem: Problem, device: Device, seed: int = 0) -> Harness:
    from tunecl.search.harness_attention import AttentionHarness  # its reference is torch's

    return AttentionHarness(problem, device, seed)


# problem kind -> harness factory (problem, device, seed)
HARNESSES: dict[str, Callable[..., Harness]] = {"gemm": GemmHarness, "conv": _conv_harness,
                                                "attention": _attention_harness}


def harness_for(problem: Problem, device: Device, seed: int = 0) -> Harness:
    """The verification harness for ``problem``'s kind.

    Raises:
        LookupError: no harness exists for that kind yet.
    """
    try:
        factory = HARNESSES[problem.kind]
    except KeyError:
        raise LookupError(f"no verification harness for {problem.kind} problems yet") from None
    return factory(problem, device, seed)
