"""Convolution families on this machine's OpenCL device (PoCL in CI), against torch on the CPU.

Every registered conv algorithm × every direction it applies to is run at its default config on the
whole shape list (which is also the ``applies``-exactness test: whenever an algorithm says yes, the
result must be right) and at random valid configs drawn with the day's seed (tests/draws.py): one per
run on each of a few shapes, and one on a few of the other shapes (``TUNECL_RANDOM_CONFIGS=full``: three
on each of the few, one on every other shape). References are float64 torch (``conv2d`` and its
autograd for the backward directions).

Tolerance: an fp32 sum of L products, in any order and tiling (split reductions included), is off
by at most γ_L·Σ|terms| with γ_L ≈ L·ε (Higham, *Accuracy and Stability*, §3.1). The test computes
Σ|terms| per output element exactly, as the same convolution of |a| and |b| in float64, and allows
(L + 2)·ε·(Σ|terms| + |β·out₀| + |bias|) — the two extra roundings are the bias and β additions.
The bound holds for every correct kernel and still catches a single missing or misplaced term,
whose size is about Σ|terms|/L, for the reduction lengths used here (L·L·ε < 1; checked by hand by
mutating kernels to drop one tap). Winograd rounds in the transformed domain, whose values exceed
|x|·|w| by the transforms' norms, so it gets a constant factor (``ERROR_FACTOR``): F(2×2,3×3)'s
coefficients are at most 1 (measured ≤ 0.06 of the plain bound; factor 4), F(4×4,3×3)'s reach 8 in Aᵀ
and 5 in Bᵀ (measured up to 1.8× the plain bound on these shapes; factor 32). The other families
measured ≤ 0.18 of the bound.
"""

from __future__ import annotations

import importlib

import draws
import numpy as np
import pytest

from tunecl import kernels, runtime
from tunecl.errors import WorkGroupTooLargeError
from tunecl.kernels.conv import conv_common
from tunecl.kernels.base import read_source
from tunecl.kernels.conv.conv_common import reduction_length
from tunecl.precision import FP32
from tunecl.problems import DIRECTIONS, ConvProblem
from tunecl.search.harness_conv import operand_shapes, reference

EPS32 = float(np.finfo(np.float32).eps)
ERROR_FACTOR = {"conv_winograd": 4.0, "conv_winograd_f4": 32.0}   # see the module docstring

SHAPES = {
    "c3_7x7_s2_b1": "n=1,c=3,h=15,w=13,k=8,r=7,s=7,stride=2,pad=3",
    "3x3_s1_odd": "n=2,c=8,h=9,w=11,k=12,r=3,s=3,pad=1",
    "3x3_s2": "n=2,c=6,h=10,w=9,k=8,r=3,s=3,stride=2,pad=1",
    "3x3_s3_p0": "n=1,c=4,h=11,w=13,k=5,r=3,s=3,stride=3,pad=0",
    "3x3_p2_dil2": "n=1,c=4,h=10,w=9,k=6,r=3,s=3,pad=2,dil=2",
    "3x3_p2_s1": "n=1,c=4,h=6,w=7,k=4,r=3,s=3,pad=2",
    "3x3_p0_s1": "n=1,c=8,h=7,w=9,k=8,r=3,s=3,pad=0",
    "groups2": "n=2,c=8,h=7,w=8,k=6,r=3,s=3,pad=1,groups=2",
    "groups32": "n=1,c=64,h=5,w=6,k=64,r=3,s=3,pad=1,groups=32",
    "depthwise": "n=2,c=16,h=9,w=8,k=16,r=3,s=3,pad=1,groups=16",
    "depthwise_s2": "n=1,c=12,h=11,w=10,k=12,r=3,s=3,stride=2,pad=1,groups=12",
    "depthwise_x2_5x5": "n=1,c=4,h=9,w=9,k=8,r=5,s=5,pad=2,groups=4",
    "1x7": "n=1,c=6,h=8,w=9,k=4,r=1,s=7,pad=0x3",
    "7x1": "n=1,c=6,h=9,w=8,k=4,r=7,s=1,pad=3x0",
    "1x1_s1": "n=2,c=16,h=6,w=5,k=24,r=1,s=1",
    "1x1_s2": "n=2,c=16,h=7,w=9,k=12,r=1,s=1,stride=2",
    "k1000": "n=1,c=8,h=3,w=3,k=1000,r=3,s=3,pad=1",
    "5x5": "n=2,c=5,h=9,w=10,k=7,r=5,s=5,pad=2",
    "out_1x1": "n=3,c=4,h=3,w=3,k=4,r=3,s=3",
    "asymmetric": "n=1,c=4,h=12,w=10,k=4,r=3,s=2,stride=2x1,pad=1x0,dil=1x2",
}
# shapes that get RANDOM_CONFIGS random configs each; each of the others gets one, OTHER_SHAPES of them
# per run (drawn), all with TUNECL_RANDOM_CONFIGS=full (tests/draws.py)
RANDOM_SHAPES = ("3x3_s1_odd", "3x3_s2", "3x3_p2_dil2", "groups2", "depthwise_s2", "1x1_s2",
                 "depthwise_x2_5x5")
RANDOM_CONFIGS = draws.count(per_run=1, full=3)
OTHER_SHAPES = draws.count(per_run=4, full=len(SHAPES) - len(RANDOM_SHAPES))
# shapes whose whole spaces are enumerated and re-checked (defaults are checked on every shape)
SPACE_SHAPES = ("c3_7x7_s2_b1", "3x3_s2", "3x3_p0_s1", "groups32", "depthwise_x2_5x5", "1x1_s2", "k1000",
                "out_1x1")

# The fp32 families: their bound is the fp32 one above. Reduced-precision families (TF32 tensor cores)
# apply only on devices with the capability and are checked at their own tolerance in test_conv_mma.py.
ALGORITHMS = {a.name: a for a in kernels.algorithms("conv") if getattr(a, "precision", FP32) == FP32}


@pytest.fixture(scope="module")
def device():
    return runtime.select_device()


def problem(shape: str, direction: str) -> ConvProblem:
    return ConvProblem.parse(SHAPES[shape]).with_direction(direction)


def check(device, algorithm, p: ConvProblem, config: dict[str, int], *, beta: float = 0.0,
          use_bias: bool = False, seed: int = 0, offsets: int = 0) -> np.ndarray:
    """Build and run one plan on random data; assert the result is within the error bound.

    With ``beta == 0`` the output starts as NaN, so a kernel that reads it fails. ``offsets`` shifts
    every tensor by that many elements inside its buffer. Returns the result.
    """
    rng = np.random.default_rng(seed)
    a_shape, b_shape, out_shape = operand_shapes(p)
    a = rng.uniform(-1, 1, a_shape).astype(np.float32)
    b = rng.uniform(-1, 1, b_shape).astype(np.float32)
    out0 = (rng.uniform(-1, 1, out_shape) if beta else np.full(out_shape, np.nan)).astype(np.float32)
    bias = rng.uniform(-1, 1, p.k).astype(np.float32) if use_bias else None

    def buffer(array: np.ndarray):
        return device.upload(np.concatenate([np.full(offsets, 7.0, np.float32), array.ravel()]))

    plan = algorithm.build(p, device, config)
    out_buf = buffer(out0)
    events = plan.run(buffer(a), buffer(b), out_buf, a_offset=offsets, b_offset=offsets,
                      out_offset=offsets, bias=None if bias is None else buffer(bias),
                      bias_offset=offsets, beta=beta)
    assert events, "run must return the events it enqueued"
    device.synchronize()
    got = device.download(out_buf, (offsets + out0.size,))[offsets:].reshape(out_shape)

    want = reference(p, a, b, bias)
    magnitude = reference(p, np.abs(a), np.abs(b), None if bias is None else np.abs(bias))
    if beta:
        want = want + beta * out0.astype(np.float64)
        magnitude = magnitude + abs(beta) * np.abs(out0.astype(np.float64))
    factor = ERROR_FACTOR.get(algorithm.name, 1.0)
    bound = factor * (reduction_length(p) + 2) * EPS32 * magnitude + 1e-30
    error = np.abs(got.astype(np.float64) - want)
    bad = ~(error <= bound)   # NaN counts as bad
    assert not bad.any(), (
        f"{algorithm.name} {config} on {p.key}: {int(bad.sum())} of {bad.size} elements out of bound, "
        f"worst error {np.nanmax(error):.3g} (bound there {bound.ravel()[np.nanargmax(error)]:.3g}), "
        f"first bad index {np.argwhere(bad)[0].tolist()}")
    return got


# -- applies-exactness and defaults ------------------------------------------------------------------
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_applies_is_exact_at_default(device, name, direction):
    """Whenever ``applies`` says yes, the default config is valid and computes the right result."""
    algorithm = ALGORITHMS[name]
    ran = 0
    for index, shape in enumerate(SHAPES):
        p = problem(shape, direction)
        if not algorithm.applies(p, device):
            assert name != "conv_direct", f"conv_direct must apply to every problem, not to {p.key}"
            continue
        config = algorithm.default(p, device)
        assert algorithm.space(p, device).is_valid(config), (p.key, config)
        # alternate: beta = 0 (output starts as NaN) without bias, beta = 0.5 with bias
        check(device, algorithm, p, config, beta=0.5 if index % 2 else 0.0,
              use_bias=bool(index % 2) and direction == "fwd", seed=index)
        ran += 1
    assert ran or name not in ("conv_direct", "conv_implicit_gemm")


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_direction_with_offsets(device, name):
    """Element offsets into every buffer (a, b, out, bias) are honoured."""
    algorithm = ALGORITHMS[name]
    for direction in DIRECTIONS:
        for shape in ("3x3_s2", "depthwise_s2", "1x1_s2", "3x3_p0_s1"):
            p = problem(shape, direction)
            if algorithm.applies(p, device):
                check(device, algorithm, p, algorithm.default(p, device), beta=1.0,
                      use_bias=direction == "fwd", offsets=5)
                break


# -- random configs ------------------------------------------------------------------------------------
def random_configs(algorithm, p: ConvProblem, device, count: int, name: str) -> list[dict[str, int]]:
    configs = algorithm.space(p, device).configs()
    return draws.rng(name).sample(configs, min(count, len(configs)))


def _run_random(device, name: str, direction: str, shapes, count: int = RANDOM_CONFIGS) -> int:
    algorithm = ALGORITHMS[name]
    ran = 0
    for j, shape in enumerate(shapes):
        p = problem(shape, direction)
        if not algorithm.applies(p, device):
            continue
        drawn = random_configs(algorithm, p, device, count, f"conv/{name}/{shape}/{direction}")
        for i, config in enumerate(drawn):
            odd = (i + j) % 2  # beta and bias alternate over configs and shapes
            try:
                check(device, algorithm, p, config, beta=0.5 if odd else 0.0,
                      use_bias=direction == "fwd" and not odd, seed=i)
            except WorkGroupTooLargeError:  # a GPU whose registers do not allow the work-group size
                continue
            ran += 1
    return ran


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_random_configs(device, name, direction):
    ran = _run_random(device, name, direction, RANDOM_SHAPES)
    if not ran:
        pytest.skip(f"{name} applies to none of the random-config shapes in {direction}")


@pytest.mark.slow
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_random_configs_on_every_shape(device, name, direction):
    """One random config on each of OTHER_SHAPES of the remaining shapes, drawn (each compile costs
    seconds on PoCL; the shapes above get RANDOM_CONFIGS each)."""
    others = [s for s in SHAPES if s not in RANDOM_SHAPES]
    shapes = draws.rng(f"conv/{name}/{direction}/shapes").sample(others, OTHER_SHAPES)
    _run_random(device, name, direction, [s for s in others if s in shapes], count=1)


# -- spaces, determinism, coverage -----------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_spaces_are_consistent(device, name):
    """Defaults are valid, every enumerated config passes the named constraints, spaces are not empty."""
    algorithm = ALGORITHMS[name]
    for shape in SPACE_SHAPES:
        for direction in DIRECTIONS:
            p = problem(shape, direction)
            if not algorithm.applies(p, device):
                continue
            space = algorithm.space(p, device)
            configs = space.configs()
            assert configs, f"{name}: empty space for {p.key}"
            assert space.violations(algorithm.default(p, device)) == []
            assert all(not space.violations(c) for c in configs[:: max(1, len(configs) // 50)])


GEMM_BACKED = sorted(n for n, a in ALGORITHMS.items() if isinstance(a, conv_common.GemmBackedAlgorithm))


@pytest.mark.parametrize("name", GEMM_BACKED)
def test_configs_stored_before_gemm_parameters_existed_stay_valid(device, name):
    """A stored config without the GEMM parameters added since (``Space.implied``: SPLITK, STREAMK,
    ASYNC, each under the ``g_`` prefix) is valid, means their implied values and computes correctly:
    the shipped results of GPUs hold such configs, which must not fall back to the default plan."""
    algorithm = ALGORITHMS[name]
    p = next(p for p in (problem(shape, "fwd") for shape in ("3x3_s1_odd", "1x1_s2"))
             if algorithm.applies(p, device))
    space = algorithm.space(p, device)
    implied = {k: v for k, v in space.implied.items() if k.startswith(conv_common.GEMM_PREFIX)}
    assert implied, f"{name}: the GEMM parameters' implied values are lost"
    default = algorithm.default(p, device)
    old = {k: v for k, v in default.items() if k not in implied}
    assert space.violations(old) == [] and space.is_valid(old)
    assert space.complete(old) == {**default, **implied}
    check(device, algorithm, p, old)


def test_results_are_deterministic(device):
    """Split reductions and everything else give bit-identical results run to run."""
    for name, algorithm in sorted(ALGORITHMS.items()):
        p = problem("3x3_s2", "bwd_weight")
        if not algorithm.applies(p, device):
            continue
        configs = [c for c in algorithm.space(p, device).configs() if c.get("SPLIT", 1) > 1]
        config = configs[len(configs) // 2] if configs else algorithm.default(p, device)
        first = check(device, algorithm, p, config, seed=3)
        second = check(device, algorithm, p, config, seed=3)
        np.testing.assert_array_equal(first, second, err_msg=f"{name} {config}")


def test_every_direction_has_two_algorithms_for_common_shapes(device):
    for shape in ("3x3_s1_odd", "3x3_s2", "1x1_s1", "1x1_s2", "c3_7x7_s2_b1", "depthwise"):
        for direction in DIRECTIONS:
            p = problem(shape, direction)
            names = [n for n, a in ALGORITHMS.items() if a.applies(p, device)]
            assert len(names) >= 2, f"{p.key}: only {names}"


def test_bias_outside_forward_is_rejected(device):
    algorithm = ALGORITHMS["conv_direct"]
    p = problem("3x3_s2", "bwd_data")
    plan = algorithm.build(p, device, algorithm.default(p, device))
    buf = device.alloc(4 * 4096)
    with pytest.raises(ValueError, match="bias"):
        plan.run(buf, buf, buf, bias=buf)


def test_invalid_config_is_rejected_before_compiling(device):
    algorithm = ALGORITHMS["conv_direct"]
    p = problem("3x3_s2", "fwd")
    config = dict(algorithm.default(p, device), LOCAL=0, CCH=4)
    with pytest.raises(ValueError, match="cch_only_with_local"):
        algorithm.build(p, device, config)


@pytest.mark.parametrize("module_name", ["conv_im2col", "conv_1x1", "conv_winograd"])
def test_gemm_families_in_chunks_of_images(device, monkeypatch, module_name):
    """A workspace cap of 1.5 images forces one image per pass: every pass must use its own images
    and bwd_weight must accumulate the passes (β of the call first, then 1)."""
    module = importlib.import_module(f"tunecl.kernels.conv.{module_name}")
    body = ("n=3,c=4,h=5,w=6,k=4,r=1,s=1,stride=2" if module_name == "conv_1x1"
            else "n=3,c=4,h=5,w=6,k=4,r=3,s=3,pad=1")
    ran = 0
    for algorithm in module.ALGORITHMS:
        def layout(p, algorithm=algorithm):
            return module.layout(p, algorithm.m) if module_name == "conv_winograd" else module.layout(p)

        for direction in DIRECTIONS:
            p = ConvProblem.parse(body).with_direction(direction)
            if not algorithm.applies(p, device):
                continue
            whole = layout(p)
            floats = whole.workspace_floats
            assert whole.chunk == 3 and floats
            monkeypatch.setattr(module, "WORKSPACE_CAP", floats * 4 // 2)
            module.layout.cache_clear()
            try:
                assert layout(p).chunk == 1
                check(device, algorithm, p, algorithm.default(p, device), beta=0.5,
                      use_bias=direction == "fwd")
            finally:
                monkeypatch.undo()
                module.layout.cache_clear()
            ran += 1
    assert ran >= 2


def test_gemm_families_do_not_apply_without_the_gemm_family(device, monkeypatch):
    monkeypatch.setattr(conv_common, "gemm_algorithm", lambda name="gemm_tiled": None)
    for name in ("conv_im2col", "conv_1x1", "conv_winograd", "conv_winograd_f4"):
        for direction in DIRECTIONS:
            assert not ALGORITHMS[name].applies(problem("1x1_s1", direction), device)
            assert not ALGORITHMS[name].applies(problem("3x3_s1_odd", direction), device)


@pytest.mark.parametrize("source", ["conv_common.cl", "conv_direct.cl", "conv_depthwise.cl",
                                    "conv_implicit_gemm.cl", "conv_im2col.cl", "conv_1x1.cl",
                                    "conv_winograd.cl"])
def test_sources_compile_alone_with_their_defaults(device, source):
    """Every tunable and geometry name has an ``#ifndef`` default, so each file is its own smoke test."""
    program = device.build(read_source("tunecl.kernels.conv", source))
    assert program.all_kernels()
