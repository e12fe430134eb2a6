"""What every registered GEMM family promises, on this machine's OpenCL device (PoCL in CI), against
numpy in float64 (``gemm_checks.py``: layouts, guards, the tolerance of the plan's precision).

Every family of ``kernels.algorithms("gemm")`` is checked for: its default config, valid for the problem,
on every case of CASES (sizes 1 in each role, K = 1, K below and not a multiple of any K tile, large K,
several tiles and a partial one in every dimension, whole tiles) in every transpose, with offsets,
padded and unaligned leading dimensions, gaps between the matrices of a batch, broadcast operands,
alpha and beta (beta == 0 with C full of NaN, which must not be read) and C's neighbours untouched;
seeded random configs of its space doing the same (``draw_spaces.py``: where they are drawn from); its
default being a searched config for tiny, batched and skinny problems; clear errors, before anything
is compiled, for configs outside its space, for the dtype it does not compute and for layouts that do
not fit their buffers; and applying exactly to its dtype, and only where the device grants what it
needs.

A family that needs a capability of the device (inline PTX: tensor cores) runs twice: built with
``emulate=True`` on any device (plain OpenCL C in place of the PTX instructions, computing the same
fragments), and with the real PTX where the device's probe granted the capability (skipped elsewhere).
Its defaults and spaces are those of a GPU that grants every capability (an H200's limits).

What one family does beyond this (its space rules, split K's reduction, stream-K's partition, the
cp.async ring, the tensor-core layouts and probes) is tested in its own ``test_gemm_*.py``.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any

import pytest
from draw_spaces import CAPABILITIES, CPU_LIKE, DRAW_SHAPE, EVERY_CAPABILITY, dtype_of, picks, random_config
from gemm_checks import (
    ALIGNED,
    ALIGNED8,
    ALIGNED_NAN_C,
    BROADCAST_A,
    BROADCAST_B,
    PACKED_NAN_C,
    TRANSPOSE_IDS,
    TRANSPOSES,
    UNALIGNED,
    check_run,
    gpu_double,
    problem,
    tiled_workspace,
    widest_aligned,
)

from tunecl import kernels, runtime
from tunecl.errors import WorkGroupTooLargeError
from tunecl.precision import TF32, algorithm_precision
from tunecl.problems import DTYPES, GemmProblem

FAMILIES = {a.name: a for a in kernels.algorithms("gemm")}
# (shape, layout): each default runs all of them. 1x1x1; sizes 1, 7, 33, 127, 257 in every role; K = 1
# with several tiles in M and N; K below any K tile; several tiles and a partial one in every dimension
# (257 x 129 x 65, in every layout kind: unaligned, batch 3 aligned, 128-bit aligned); whole 128 tiles
# (where TF32's rounding must show); a long reduction of a small output.
CASES = [((1, 1, 1), PACKED_NAN_C), ((7, 33, 127), ALIGNED), ((7, 33, 127), ALIGNED8), ((33, 127, 7), UNALIGNED),
         ((127, 257, 33), ALIGNED_NAN_C), ((257, 7, 1), BROADCAST_A), ((1, 257, 127), BROADCAST_B),
         ((33, 1, 257), PACKED_NAN_C), ((257, 127, 257), ALIGNED), ((257, 129, 65), UNALIGNED),
         ((257, 129, 65), ALIGNED), ((257, 129, 65), ALIGNED8), ((128, 128, 128), ALIGNED_NAN_C),
         ((128, 128, 128), BROADCAST_A), ((130, 300, 1), ALIGNED_NAN_C), ((7, 33, 4099), BROADCAST_B)]
# the random configs' shapes: the sizes of CASES that are all odd, where every layout is either wholly
# vector-aligned or wholly scalar, so that each config compiles two variants; and whole tiles / K = 1 with
# M and N of several tiles, run in a layout aligned at those sizes (the vector variant compiled already)
RANDOM_SHAPES = [shape for shape in dict.fromkeys(shape for shape, _ in CASES) if all(size % 2 for size in shape)]
RANDOM_EVEN_SHAPES = [(128, 128, 128), (130, 300, 1)]
# where the default must also be among the searched configs (enumerating a space costs up to seconds)
SEARCHED_CASES = [((257, 127, 257), ALIGNED)]
# tiny, batched and skinny problems (fc layers at batch 2, vgg16's classifier): pruning once left spaces empty
SMALL_AND_SKINNY = ["2,4096,25088,0,1", "2,25088,4096", "4096,2,25088", "1,100000,3", "1,1,1", "3,8,4,0,0,72"]
# what a device without a capability lacks, for the skip reasons
LACKS = {runtime.MMA_TF32: "no tensor cores via PTX", runtime.MMA_F16: "no tensor cores via PTX",
         runtime.WGMMA: "no Hopper tensor cores via PTX"}


def needed_capabilities(algorithm: Any) -> frozenset[str]:
    """The capabilities without which ``algorithm`` does not apply (on a GPU that grants all others)."""
    p = GemmProblem(64, 64, 64, dtype=dtype_of(algorithm))
    return frozenset(c for c in CAPABILITIES
                     if not algorithm.applies(p, gpu_double(capabilities=CAPABILITIES - {c})))


@dataclasses.dataclass(frozen=True)
class Subject:
    """One family as run here: ``native`` (its own kernel), or for a family that needs a capability
    ``emulated`` (plain C in place of the PTX) or ``ptx`` (the real instructions)."""

    algorithm: Any
    mode: str

    @property
    def name(self) -> str:
        return self.algorithm.name

    @property
    def dtype(self) -> str:
        return dtype_of(self.algorithm)

    def config_device(self, device):
        """The device whose defaults and spaces this subject runs: this one, or for a family that needs
        a capability a GPU that grants every capability."""
        return device if self.mode == "native" else EVERY_CAPABILITY

    def build(self, p: GemmProblem, device, config):
        if self.mode == "native":
            return self.algorithm.build(p, device, config)
        return self.algorithm.build(p, device, config, emulate=self.mode == "emulated")


def _subjects() -> list[Any]:
    subjects = []
    for name, algorithm in FAMILIES.items():
        needs = needed_capabilities(algorithm)
        if not needs:
            subjects.append(pytest.param(Subject(algorithm, "native"), id=name))
            continue
        lacking = ", ".join(f"the device has no {c} capability ({LACKS[c]})" for c in sorted(needs))
        ptx = [pytest.mark.skipif(f"not {set(needs)!r} <= runtime.select_device().capabilities", reason=lacking),
               pytest.mark.gpu]
        subjects += [pytest.param(Subject(algorithm, "emulated"), id=f"{name}-emulated"),
                     pytest.param(Subject(algorithm, "ptx"), id=f"{name}-ptx", marks=ptx)]
    return subjects


SUBJECTS = _subjects()
PICKS = {name: picks(name) for name in FAMILIES}


def _no_workspace(device, p: GemmProblem, config) -> int:
    return 0


# the bytes a family's plans hold besides the operands, where the family defines them exactly
WORKSPACE = {"gemm_tiled": tiled_workspace, "gemm_direct": _no_workspace, "gemm_simt": _no_workspace}


def check_subject_run(device, subject: Subject, p: GemmProblem, config, layout, rng, **kwargs) -> None:
    """``check_run`` of ``subject`` built its way, with the workspace its family's plans must hold."""
    expected = WORKSPACE.get(subject.name)
    workspace = expected(device, p, config) if expected else None
    check_run(device, subject.algorithm, p, config, layout, rng, build=subject.build, workspace=workspace,
              **kwargs)


def _refuse_to_compile(*args, **kwargs):
    raise AssertionError("a refused config reached the compiler")


# ---- the registry ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", FAMILIES)
def test_applies_exactly_to_its_dtype_where_its_capabilities_are_granted(name):
    algorithm = FAMILIES[name]
    assert kernels.algorithm(name) is algorithm and algorithm.kind == "gemm"
    assert isinstance(algorithm.version, int) and algorithm.version >= 1
    dtype, needs = dtype_of(algorithm), needed_capabilities(algorithm)
    for transposes in TRANSPOSES:  # every layout the backend passes, batched or not
        for batch in (1, 3):
            assert algorithm.applies(problem((33, 17, 29), transposes, batch, dtype), EVERY_CAPABILITY)
    for other in set(DTYPES) - {dtype}:
        assert not algorithm.applies(GemmProblem(64, 64, 64, dtype=other), EVERY_CAPABILITY)
    p = GemmProblem(64, 64, 64, dtype=dtype)
    assert algorithm.applies(p, gpu_double(capabilities=needs))
    if needs:
        assert "emulate" in inspect.signature(algorithm.build).parameters, "a PTX family builds emulated too"
        assert needs == {algorithm.capability}, f"{name} needs {set(needs)}, declares {algorithm.capability}"
        assert not algorithm.applies(p, gpu_double(capabilities=frozenset()))
        assert not algorithm.applies(p, gpu_double())  # a device without the attribute has none


@pytest.mark.parametrize("name", FAMILIES)
def test_other_dtypes_are_refused_before_compiling(device, monkeypatch, name):
    algorithm = FAMILIES[name]
    dtype = dtype_of(algorithm)
    source = device if not needed_capabilities(algorithm) else EVERY_CAPABILITY
    config = algorithm.default(GemmProblem(64, 64, 64, dtype=dtype), source)
    monkeypatch.setattr(device, "build", _refuse_to_compile)
    for other in set(DTYPES) - {dtype}:
        p = GemmProblem(64, 64, 64, dtype=other)
        for call, args in ((algorithm.space, (p, source)), (algorithm.default, (p, source)),
                           (algorithm.build, (p, source, config))):
            with pytest.raises(ValueError, match=f"{name} computes {dtype} GEMMs, not .*dtype={other}"):
                call(*args)


# ---- defaults ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("transposes", TRANSPOSES, ids=TRANSPOSE_IDS)
@pytest.mark.parametrize("subject", SUBJECTS)
def test_default_config_matches_numpy(device, rng, subject, transposes):
    """The default for each case is valid (and, for one, a searched config) and computes it right."""
    algorithm, source = subject.algorithm, subject.config_device(device)
    tf32 = algorithm_precision(algorithm) == TF32
    for shape, layout in CASES:
        p = problem(shape, transposes, layout.batch, subject.dtype)
        config = algorithm.default(p, source)
        space = algorithm.space(p, source)
        assert space.is_valid(config), (p.key, config, space.violations(config))
        if (shape, layout) in SEARCHED_CASES:
            assert config in space.configs(), f"the default for {p.key} must be a searched config"
        check_subject_run(device, subject, p, config, layout, rng,
                          expect_tf32=tf32 and shape == (128, 128, 128))


@pytest.mark.parametrize("name", FAMILIES)
def test_default_is_searched_for_tiny_batched_and_skinny_problems(device, name):
    """On this device (where the family applies), a GPU granting just what the family needs, and one
    granting every capability."""
    algorithm = FAMILIES[name]
    suffix = ",dtype=float16" if dtype_of(algorithm) == "float16" else ""
    for spec in SMALL_AND_SKINNY:
        p = GemmProblem.from_spec(spec + suffix)
        targets = {"gpu": gpu_double(capabilities=needed_capabilities(algorithm)), "every": EVERY_CAPABILITY}
        if algorithm.applies(p, device):
            targets["device"] = device
        for target, dev in targets.items():
            configs = algorithm.space(p, dev).configs()
            assert configs, f"{name}: empty space for {p.key} on {target}"
            assert algorithm.default(p, dev) in configs, f"{name}: default not searched for {p.key} on {target}"


# ---- seeded random configs ---------------------------------------------------------------------------

def _random_params() -> list[Any]:
    return [pytest.param(param.values[0], position, id=f"{param.id}-{position}", marks=param.marks)
            for param in SUBJECTS for position in range(len(PICKS[param.values[0].name]))]


@pytest.mark.parametrize("subject, position", _random_params())
def test_random_config_matches_numpy(device, rng, subject, position):
    """A config drawn from the family's space, valid for each problem it runs, on four cases: three of
    the odd shapes (the vector and scalar variants, beta == 0 and not, a broadcast operand), then whole
    tiles or K = 1. A config this device cannot launch at its work-group size (a GPU's registers), or
    whose emulation needs more local memory than it has, passes to the next draw, as the tuner passes
    over it."""
    algorithm = subject.algorithm
    index = PICKS[subject.name][position]
    layouts = ([PACKED_NAN_C, widest_aligned(subject.dtype)] if index % 2 == 0 else [ALIGNED_NAN_C, UNALIGNED]) + [
        (BROADCAST_A, BROADCAST_B)[index % 4 // 2]]
    cases = [(RANDOM_SHAPES[(index + 3 * step) % len(RANDOM_SHAPES)], layout)
             for step, layout in enumerate(layouts)]
    cases.append((RANDOM_EVEN_SHAPES[index % 2], layouts[0]))
    refused = []
    for attempt in range(6):
        transposes, config = random_config(algorithm, index, attempt)
        if subject.mode == "native":
            assert algorithm.space(problem(DRAW_SHAPE, transposes, dtype=subject.dtype), device).is_valid(config)
        try:
            for shape, layout in cases:
                p = problem(shape, transposes, layout.batch, subject.dtype)
                space = algorithm.space(p, subject.config_device(device))
                assert space.is_valid(config), (p.key, config, space.violations(config))
                check_subject_run(device, subject, p, config, layout, rng)
            return
        except WorkGroupTooLargeError as error:
            refused.append(str(error))
        except ValueError as error:
            if subject.mode != "emulated" or "emulated" not in str(error):
                raise
            refused.append(str(error))
    pytest.skip("this device cannot run any of the drawn configs: " + "; ".join(refused))


# ---- refusals ------------------------------------------------------------------------------------------

def _hole(values: tuple[int, ...]) -> int:
    """A value not among ``values``: the first gap between their least and greatest, else one above."""
    return next((v for v in range(min(values), max(values)) if v not in values), max(values) + 1)


@pytest.mark.parametrize("name", FAMILIES)
def test_configs_outside_the_space_are_named_and_never_compiled(device, monkeypatch, name):
    """Unknown, missing and out-of-range parameters (a value no device takes, and one that another
    device's space takes but this one's does not: NVIDIA's register caps elsewhere, a GPU's warp shapes
    on a CPU): each named in ``violations`` and in build's ValueError."""
    algorithm = FAMILIES[name]
    source = device if not needed_capabilities(algorithm) else EVERY_CAPABILITY
    p = GemmProblem(64, 64, 64, dtype=dtype_of(algorithm))
    space = algorithm.space(p, source)
    default = algorithm.default(p, source)
    required = next(param for param in space.params if param not in space.implied)
    cases = [({**default, "NO_SUCH_PARAMETER": 1}, "unknown parameter NO_SUCH_PARAMETER"),
             ({k: v for k, v in default.items() if k != required}, f"missing parameter {required}")]
    cases += [({**default, param: _hole(values)}, f"{param}={_hole(values)} not in {values}")
              for param, values in space.params.items()]
    for other in (EVERY_CAPABILITY, CPU_LIKE):
        if other is not source and algorithm.applies(p, other):
            for param, values in algorithm.space(p, other).params.items():
                foreign = [v for v in values if v not in space.params.get(param, values)]
                if foreign:
                    cases.append(({**default, param: foreign[0]},
                                  f"{param}={foreign[0]} not in {space.params[param]}"))
    monkeypatch.setattr(device, "build", _refuse_to_compile)
    for config, violation in cases:
        assert violation in space.violations(config), (violation, space.violations(config))
        with pytest.raises(ValueError, match=re.escape(violation)):
            algorithm.build(p, source, config)


# the problem of one case (so its default is compiled already), batched, with odd sizes
BUILT_SHAPE, BUILT_BATCH = (7, 33, 127), 2


@pytest.mark.parametrize("subject", SUBJECTS)
def test_run_rejects_layouts_that_do_not_fit(device, subject):
    p = problem(BUILT_SHAPE, (False, False), BUILT_BATCH, subject.dtype)
    plan = subject.build(p, device, subject.algorithm.default(p, subject.config_device(device)))
    size = DTYPES[subject.dtype] * p.batch
    a, b, c = device.alloc(size * p.m * p.k), device.alloc(size * p.k * p.n), device.alloc(size * p.m * p.n)
    with pytest.raises(ValueError, match=f"lda=4 is smaller than the row length {p.k}"):
        plan.run(a, b, c, lda=4)
    with pytest.raises(ValueError, match="buffer a"):
        plan.run(a, b, c, a_offset=1)
    with pytest.raises(ValueError, match="overlap"):
        plan.run(a, b, c, stride_c=8)
    with pytest.raises(ValueError, match="negative"):
        plan.run(a, b, c, b_offset=-1)


@pytest.mark.parametrize("subject", SUBJECTS)
def test_a_kernel_the_device_cannot_launch_at_its_work_group_size_fails_at_build(device, monkeypatch, subject):
    """Where registers cap the work-group size below the config's (CL_KERNEL_WORK_GROUP_SIZE), the plan
    says so when it is built instead of failing every launch."""
    p = problem(BUILT_SHAPE, (False, False), BUILT_BATCH, subject.dtype)
    config = subject.algorithm.default(p, subject.config_device(device))
    monkeypatch.setattr(device, "kernel_max_threads", lambda kernel: 1)
    with pytest.raises(WorkGroupTooLargeError, match="at most 1 threads per work-group"):
        subject.build(p, device, config)
