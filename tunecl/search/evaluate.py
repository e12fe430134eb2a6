"""Evaluate one candidate — check, build, bind, verify, time — and return a :class:`Result`, never raise.

Stages and what each failure becomes:

==============  ===========================================  ===============
stage           failure                                      status
==============  ===========================================  ===============
check           the config breaks a constraint of its space  INVALID (nothing is compiled)
build           ``BuildError`` or any candidate error        COMPILE_ERROR
bind/verify     any candidate error                          LAUNCH_ERROR
verify          output differs / guards or inputs touched    WRONG_RESULT
time            past ``TimingPolicy.timeout``                TIMEOUT
time            any candidate error                          LAUNCH_ERROR
==============  ===========================================  ===============
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping

import pyopencl as cl

from tunecl.errors import BuildError
from tunecl.kernels.base import Algorithm, Space
from tunecl.problems import Problem
from tunecl.runtime import Device
from tunecl.search.harness import Binding, Harness
from tunecl.search.harness_registry import harness_for
from tunecl.search.measure import MeasureTimeout, TimingPolicy, measure
from tunecl.search.result import Result, Status

# What a candidate's own code can raise for a config it cannot handle: OpenCL errors (``cl.Error``,
# including out-of-resources and ``cl.MemoryError``), our ``BuildError``, and the plain errors of
# Python geometry code in a family (a ``ValueError`` or ``ArithmeticError`` for an impossible tiling,
# a ``LookupError`` for a missing parameter, a ``TypeError`` for a bad argument, a host
# ``MemoryError``). These are caught per candidate so that one bad config cannot end a run of hours.
# Anything else — ``KeyboardInterrupt``, ``SystemExit``, an ``AssertionError`` or ``RuntimeError`` in
# tunecl itself, an Optuna or database error — still propagates: those are not about the candidate.
CANDIDATE_ERRORS: tuple[type[BaseException], ...] = (
    cl.Error, BuildError, ValueError, ArithmeticError, LookupError, TypeError, MemoryError)


def _describe(error: BaseException) -> str:
    """One line for a Result message: the error, and where it came from when it is not OpenCL's."""
    text = str(error).strip()
    if isinstance(error, BuildError):
        # keep the first lines of the build log; full logs can be megabytes
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return " | ".join(lines[:6])[:1000]
    if isinstance(error, cl.Error):
        return f"{type(error).__name__}: {text}"[:1000]
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(error).__name__}: {text}{where}"[:1000]


def evaluate(algorithm: Algorithm, problem: Problem, device: Device, config: Mapping[str, int], *,
             harness: Harness | None = None, space: Space | None = None,
             policy: TimingPolicy | None = None, verify: bool = True) -> Result:
    """Evaluate ``config`` of ``algorithm`` on ``problem``; every outcome is a :class:`Result`.

    Args:
        algorithm: the kernel family variant.
        problem: what to compute.
        device: where to compute it.
        config: the parameter values.
        harness: inputs and reference for ``problem`` (pass one per problem: its reference is computed
            once and reused; default: a new one from :func:`harness_for`).
        space: ``algorithm.space(problem, device)`` if already built (saves rebuilding it).
        policy: how to time (default: ``TimingPolicy()``).
        verify: compare against the reference before timing (turn off only for benchmarks of configs
            verified before).

    Returns:
        A Result with status OK and raw times, or the first failure's status and message.
    """
    name = algorithm.name
    config = dict(config)
    try:
        space = space if space is not None else algorithm.space(problem, device)
        broken = space.violations(config)
    except CANDIDATE_ERRORS as error:
        return Result(name, config, Status.INVALID, message=f"space: {_describe(error)}")
    if broken:
        return Result(name, config, Status.INVALID, message="violates " + ", ".join(broken))

    try:
        plan = algorithm.build(problem, device, config)
    except CANDIDATE_ERRORS as error:
        return Result(name, config, Status.COMPILE_ERROR, message=_describe(error))

    harness = harness if harness is not None else harness_for(problem, device)
    binding: Binding | None = None
    try:
        binding = harness.bind(plan)
        if verify:
            wrong = binding.check()
            if wrong:
                return Result(name, config, Status.WRONG_RESULT, message=wrong)
        with device.profiling():  # event times (the backend's queue does not profile by default)
            timing = measure(binding.launch, policy or TimingPolicy())
    except MeasureTimeout as error:
        return Result(name, config, Status.TIMEOUT, message=str(error))
    except CANDIDATE_ERRORS as error:
        return Result(name, config, Status.LAUNCH_ERROR, message=_describe(error))
    finally:
        if binding is not None:
            try:
                device.synchronize()  # nothing of this candidate may still run when the next starts
                binding.release()
            except cl.Error:  # a failed launch can leave the queue in error; buffers go with the GC
                pass
    return Result(name, config, Status.OK, timing.times, timing.note)
