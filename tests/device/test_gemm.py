"""gemm_tiled and gemm_direct on this machine's OpenCL device (PoCL in CI) against numpy in float64.

Tolerance: an output is a sum of K fp32 products accumulated in fp32, in an order that depends on the
config (tile depth, unrolling, split K). For random data its rounding error grows like sqrt(K) (K in
the worst case) relative to S = |alpha|·(|op(A)| @ |op(B)|) + |beta|·|C|, the sum of magnitudes,
which stays meaningful under cancellation. We accept |out - ref| <= 8·eps32·sqrt(K)·S, several times
the typical error yet far below what an indexing bug costs: one product lost or counted twice moves an
output by about S/K, which exceeds the tolerance for every K here.

Compile cost on PoCL (~0.3-1 s per config) shapes the tests: each compiled config runs several
shapes and layouts (M, N, K, lds, offsets and batch are run-time arguments of the same binary).
"""

from __future__ import annotations

import dataclasses
import math
import random
import types

import draws
import draw_spaces
import numpy as np
import pytest

from tunecl import kernels
from tunecl.errors import WorkGroupTooLargeError
from tunecl.kernels import gemm, gemm_direct, gemm_pretrans
from tunecl.problems import GemmProblem

ALGORITHMS = {"gemm_tiled": gemm.GemmTiled(), "gemm_direct": gemm_direct.GemmDirect()}
TRANSPOSES = [(False, False), (False, True), (True, False), (True, True)]
# (M, N, K): every size of 1, 7, 33, 127, 257 in every role.
SHAPES = [(1, 1, 1), (7, 33, 127), (33, 127, 7), (127, 257, 33), (257, 7, 1), (1, 257, 127),
          (33, 1, 257), (257, 127, 257)]
EPS32 = float(np.finfo(np.float32).eps)
GUARD = 5  # elements after the last matrix element, checked untouched in C


def _fake_device(local_mem: int, max_wg: int, vendor: str = "NVIDIA Corporation", units: int = 132):
    fingerprint = types.SimpleNamespace(vendor=vendor, device_type="gpu", compute_units=units)
    return types.SimpleNamespace(local_mem_size=local_mem, max_work_group_size=max_wg,
                                 fingerprint=fingerprint)


H200 = _fake_device(local_mem=48 * 1024, max_wg=1024)
# Random configs are drawn from the space a GPU sees (vendor-neutral: no NVIDIA build options), which
# keeps small tiles that the 2-core CPU's space prunes; its limits are stricter than PoCL's.
DRAW_DEVICE = _fake_device(local_mem=48 * 1024, max_wg=1024, vendor="Generic")
DRAW_SHAPE = (2048, 256, 256)  # tiles up to 256 fit, vector loads fit, several GM bands


@dataclasses.dataclass(frozen=True)
class Layout:
    """How the operands sit in their buffers for one run (packed with default arguments if empty)."""

    batch: int = 1
    alpha: float = 1.0
    beta: float = 0.0
    offsets: tuple[int, int, int] = (0, 0, 0)  # elements before matrix 0 of A, B, C
    pads: tuple[int, int, int] = (0, 0, 0)     # ld - (row length rounded up to `align`), per operand
    gap: int = 0                               # extra elements between the matrices of a batch
    broadcast: str = ""                        # "a" or "b": that operand has batch stride 0
    align: int = 1                             # leading dimensions are multiples of this

    @property
    def packed(self) -> bool:
        return self.offsets == (0, 0, 0) and self.pads == (0, 0, 0) and not self.gap and not self.broadcast

    def ld(self, operand: int, cols: int) -> int:
        return -(-cols // self.align) * self.align + self.pads[operand]


# Aligned layouts (offsets, lds, batch strides multiple of 4) take the vector paths, with the matrix
# edges inside vectors for odd sizes; unaligned ones the scalar fallback variant. beta == 0 runs fill C
# with NaN: C must not be read.
PACKED_NAN_C = Layout()
ALIGNED_NAN_C = Layout(batch=2, alpha=-0.5, offsets=(8, 4, 4), pads=(4, 0, 8), gap=4, align=4)
ALIGNED = Layout(batch=3, alpha=0.75, beta=-1.25, offsets=(4, 8, 12), pads=(4, 8, 4), gap=4, align=4)
UNALIGNED = Layout(batch=2, alpha=-1.5, beta=0.5, offsets=(1, 3, 5), pads=(3, 1, 2), gap=1)
BROADCAST_A = Layout(batch=3, alpha=2.0, beta=1.0, offsets=(0, 4, 0), pads=(0, 0, 4), broadcast="a", align=4)
BROADCAST_B = Layout(batch=2, beta=-0.5, offsets=(3, 0, 1), pads=(1, 0, 0), broadcast="b", gap=3)


def matrix_view(flat: np.ndarray, offset: int, ld: int, rows: int, cols: int) -> np.ndarray:
    """The rows x cols matrix at ``offset`` with row stride ``ld`` inside ``flat`` (a writable view)."""
    return np.lib.stride_tricks.as_strided(flat[offset:], (rows, cols), (ld * flat.itemsize, flat.itemsize))


def place(rng: np.random.Generator, batch: int, rows: int, cols: int, offset: int, ld: int, stride: int,
          fill: float | None = None,
          outside: float | None = np.nan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A flat buffer with ``batch`` random (or ``fill``) matrices at ``offset + b * stride``.

    Elements outside the matrices hold ``outside`` (random if None): NaN makes any read of them show.
    Returns (flat buffer, the matrices as placed (batch x rows x cols), mask of the matrix elements).
    """
    size = offset + (batch - 1) * stride + (rows - 1) * ld + cols + GUARD
    flat = (rng.standard_normal(size) if outside is None else np.full(size, outside)).astype(np.float32)
    mask = np.zeros(size, dtype=bool)
    for b in range(batch):
        view = matrix_view(flat, offset + b * stride, ld, rows, cols)
        if b == 0 or stride:
            view[...] = rng.standard_normal((rows, cols)) if fill is None else fill
        matrix_view(mask, offset + b * stride, ld, rows, cols)[...] = True
    mats = np.stack([matrix_view(flat, offset + b * stride, ld, rows, cols) for b in range(batch)])
    return flat, mats, mask


def check_run(device, algorithm, problem: GemmProblem, config, layout: Layout, rng) -> None:
    """Build ``config`` for ``problem`` laid out as ``layout``, run it, compare with numpy."""
    p = problem
    plan = algorithm.build(p, device, config)
    splitk = config.get("SPLITK", 1)
    workspace = 4 * splitk * p.batch * p.m * gemm.workspace_ld(p.n) if splitk > 1 else 0
    if config.get("STREAMK"):  # two MWG x NWG tiles per stream-K work-group, if the last wave is part-filled
        tiles = -(-p.m // config["MWG"]) * -(-p.n // config["NWG"]) * p.batch
        groups = config["STREAMK"] * gemm.compute_units(device)
        workspace += 4 * 2 * groups * config["MWG"] * config["NWG"] if tiles % groups else 0
    # ASYNC (gemm_tiled) copies an operand stored the other way first: the copies are workspace too
    workspace += 4 * sum(gemm_pretrans.workspace_words(p, gemm_pretrans.with_layout(p, *gemm.kernel_layout(p, config))))
    assert (plan.algorithm, plan.problem, plan.config, plan.workspace_bytes) == (algorithm.name, p, config, workspace)
    shape_a = (p.k, p.m) if p.trans_a else (p.m, p.k)
    shape_b = (p.n, p.k) if p.trans_b else (p.k, p.n)
    lds = (layout.ld(0, shape_a[1]), layout.ld(1, shape_b[1]), layout.ld(2, p.n))
    strides = [shape_a[0] * lds[0] + layout.gap, shape_b[0] * lds[1] + layout.gap, p.m * lds[2] + layout.gap]
    if layout.broadcast:
        strides["ab".index(layout.broadcast)] = 0
    a_flat, a_mats, _ = place(rng, p.batch, *shape_a, layout.offsets[0], lds[0], strides[0])
    b_flat, b_mats, _ = place(rng, p.batch, *shape_b, layout.offsets[1], lds[1], strides[1])
    c_flat, c_mats, c_mask = place(rng, p.batch, p.m, p.n, layout.offsets[2], lds[2], strides[2],
                                   fill=np.nan if layout.beta == 0 else None, outside=None)
    a_buf, b_buf, c_buf = device.upload(a_flat), device.upload(b_flat), device.upload(c_flat)
    names = ("a_offset", "b_offset", "c_offset", "lda", "ldb", "ldc", "stride_a", "stride_b", "stride_c")
    layout_args = {} if layout.packed else dict(zip(names, (*layout.offsets, *lds, *strides), strict=True))
    events = plan.run(a_buf, b_buf, c_buf, alpha=layout.alpha, beta=layout.beta, **layout_args)
    assert isinstance(events, list) and events
    events[-1].wait()
    out_flat = device.download(c_buf, c_flat.shape)

    op_a = a_mats.astype(np.float64).transpose(0, 2, 1) if p.trans_a else a_mats.astype(np.float64)
    op_b = b_mats.astype(np.float64).transpose(0, 2, 1) if p.trans_b else b_mats.astype(np.float64)
    ref = layout.alpha * (op_a @ op_b)
    scale = abs(layout.alpha) * (np.abs(op_a) @ np.abs(op_b))
    if layout.beta != 0:
        ref += layout.beta * c_mats
        scale += abs(layout.beta) * np.abs(c_mats)
    out = np.stack([matrix_view(out_flat, layout.offsets[2] + b * strides[2], lds[2], p.m, p.n)
                    for b in range(p.batch)])
    tolerance = 8 * EPS32 * math.sqrt(p.k) * scale
    bad = ~(np.abs(out - ref) <= tolerance)  # NaN counts as bad
    where = f"{algorithm.name} {p.key} {layout} config={config}"
    assert not bad.any(), (f"{bad.sum()} of {bad.size} outputs wrong, first at {np.argwhere(bad)[0]}: "
                           f"{out[bad][0]} vs {ref[bad][0]}; {where}")
    np.testing.assert_array_equal(out_flat[~c_mask], c_flat[~c_mask], err_msg=f"wrote outside C: {where}")


def check_launchable_draw(draw, index: int, check) -> None:
    """``check(transposes, config)`` on draw ``index``; where this device cannot launch the config at
    its work-group size (a GPU's registers), on the next draw instead, as the tuner passes over it."""
    refused = []
    for attempt in range(6):
        transposes, config = draw(index, attempt)
        try:
            check(transposes, config)
            return
        except WorkGroupTooLargeError as error:
            refused.append(str(error))
    pytest.skip("this device cannot launch any of the drawn configs: " + "; ".join(refused))


def problem(shape: tuple[int, int, int], transposes: tuple[bool, bool], batch: int = 1) -> GemmProblem:
    return GemmProblem(*shape, *transposes, batch=batch)


# ---- defaults ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("transposes", TRANSPOSES, ids=["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("name", ALGORITHMS)
def test_default_config_matches_numpy(device, rng, name, transposes):
    algorithm = ALGORITHMS[name]
    layouts = [PACKED_NAN_C, ALIGNED, UNALIGNED, ALIGNED_NAN_C, BROADCAST_A, BROADCAST_B]
    for index, shape in enumerate(SHAPES):
        layout = layouts[index % len(layouts)]
        p = problem(shape, transposes, layout.batch)
        config = algorithm.default(p, device)
        if index == len(SHAPES) - 1:  # enumerating a space costs ~1 s on this machine: check one
            assert config in algorithm.space(p, device).configs(), "the default must be a searched config"
        check_run(device, algorithm, p, config, layout, rng)


# ---- seeded random configs ---------------------------------------------------------------------------

CONFIGS_PER_ALGORITHM = 32
# the draws checked against numpy: 12 of 1000 per run, drawn with the day's seed; the first CONFIGS_PER_ALGORITHM
# with TUNECL_RANDOM_CONFIGS=full (tests/draws.py)
PICKS = draws.Picks("gemm/random", per_run=12, full=CONFIGS_PER_ALGORITHM)
_spaces: dict[tuple[str, bool, bool], list[dict[str, int]]] = {}


def random_config(name: str, index: int) -> tuple[tuple[bool, bool], dict[str, int]]:
    """Config ``index`` of a seeded draw from the space of DRAW_SHAPE on DRAW_DEVICE.

    Every eighth tiled draw is among the unstaged configs (a few % of the space, else rarely drawn).
    """
    transposes = TRANSPOSES[index % 4]
    key = (name, *transposes)
    if key not in _spaces:
        p = problem(DRAW_SHAPE, transposes)
        _spaces[key] = (draw_spaces.tiled_configs(p, DRAW_DEVICE, gemm.CP_ASYNC in gemm.capabilities(DRAW_DEVICE))
                        if name == "gemm_tiled" else ALGORITHMS[name].space(p, DRAW_DEVICE).configs())
    configs = _spaces[key]
    if name == "gemm_tiled" and index % 8 == 7:
        configs = [c for c in configs if c["SA"] == 0]
    return transposes, random.Random(1000 * index + len(name)).choice(configs)


@pytest.mark.parametrize("position", range(len(PICKS)))
@pytest.mark.parametrize("name", ALGORITHMS)
def test_random_config_matches_numpy(device, rng, name, position):
    index = PICKS[position]
    transposes, config = random_config(name, index)
    algorithm = ALGORITHMS[name]
    assert algorithm.space(problem(DRAW_SHAPE, transposes), device).is_valid(config)
    # Every config runs both compiled variants (vector and scalar fallback), beta == 0 and not.
    layouts = ([PACKED_NAN_C, ALIGNED] if index % 2 == 0 else [ALIGNED_NAN_C, UNALIGNED]) + [
        (BROADCAST_A, BROADCAST_B)[index % 4 // 2]]
    for step, layout in enumerate(layouts):
        shape = SHAPES[(index + 3 * step) % len(SHAPES)]
        try:
            check_run(device, algorithm, problem(shape, transposes, layout.batch), config, layout, rng)
        except WorkGroupTooLargeError as error:  # a GPU whose registers do not allow the work-group size
            pytest.skip(f"this device cannot run the config: {error}")


def test_random_configs_are_distinct_and_cover_variants():
    """The random draws exercise the variants that matter (staging, double buffering, strides)."""
    tiled = [random_config("gemm_tiled", i)[1] for i in range(CONFIGS_PER_ALGORITHM)]
    assert len({tuple(sorted(c.items())) for c in tiled}) == len(tiled)
    for name in ("SA", "DB", "STRM", "STRN", "PAD", "GM", "KWI", "VWA", "SPLITK"):
        assert len({c[name] for c in tiled}) > 1, f"random tiled configs never vary {name}"
    direct = [random_config("gemm_direct", i)[1] for i in range(CONFIGS_PER_ALGORITHM)]
    for name in ("KSL", "VWK", "MWID", "NWID"):
        assert len({c[name] for c in direct}) > 1, f"random direct configs never vary {name}"


def test_mixed_staging_and_unstaged_configs(device, rng):
    """Valid configs outside the searched space (one operand staged, none staged) still compute."""
    algorithm = ALGORITHMS["gemm_tiled"]
    for transposes in TRANSPOSES:
        p = problem((33, 127, 257), transposes, batch=2)
        base = algorithm.default(p, device)
        unstaged = {**base, "SA": 0, "SB": 0, "DB": 0, "PAD": 0, "MDIMA": base["MDIMC"],
                    "NDIMB": base["NDIMC"], "VWA": 1, "VWB": 1}
        only_a = {**base, "SB": 0, "DB": 1, "NDIMB": base["NDIMC"], "VWB": 1}
        only_b = {**base, "SA": 0, "DB": 1, "MDIMA": base["MDIMC"], "VWA": 1}
        for config in (unstaged, only_a, only_b):
            assert not algorithm.space(p, device).violations(config)
            check_run(device, algorithm, p, config, ALIGNED if transposes[0] else UNALIGNED, rng)


# ---- invalid configs and run arguments ---------------------------------------------------------------

def _refuse_to_compile(*args, **kwargs):
    raise AssertionError("an invalid config reached the compiler")


@pytest.mark.parametrize("name, changes, violation", [
    ("gemm_tiled", {"MWG": 16, "MDIMC": 16, "VWM": 4}, "MWI_multiple_of_VWM"),
    ("gemm_tiled", {"MWG": 64, "MDIMC": 32, "MDIMA": 8, "KWG": 8, "VWA": 4}, "A_tile_load_layout"),
    ("gemm_tiled", {"MWG": 16, "MDIMC": 32}, "MWG_multiple_of_MDIMC"),
    ("gemm_tiled", {"KWG": 8, "KWI": 16}, "KWI=16 not in (2, 8)"),
    ("gemm_tiled", {"SA": 0, "SB": 0, "DB": 1}, "DB_PAD_need_local_memory"),
    ("gemm_tiled", {"MAXRREG": 128}, "MAXRREG=128 not in (0,)"),  # not an NVIDIA device
    ("gemm_direct", {"KSL": 3}, "KSL=3 not in"),
])
def test_invalid_config_is_named_and_never_compiled(device, monkeypatch, name, changes, violation):
    if "MAXRREG" in changes and "nvidia" in device.fingerprint.vendor.lower():
        pytest.skip("-cl-nv-maxrregcount is a valid tunable on NVIDIA devices")
    algorithm = ALGORITHMS[name]
    p = problem((64, 64, 64), (False, False))
    config = {**algorithm.default(p, device), **changes}
    assert any(violation in v for v in algorithm.space(p, device).violations(config))
    monkeypatch.setattr(device, "build", _refuse_to_compile)
    with pytest.raises(ValueError, match=violation.split("=")[0]):
        algorithm.build(p, device, config)




def test_device_limits_are_named_constraints():
    p = problem((4096, 4096, 4096), (False, True))
    small = _fake_device(local_mem=8 * 1024, max_wg=128)
    tiled = ALGORITHMS["gemm_tiled"]
    config = tiled.default(p, H200)
    assert (config["MDIMC"] * config["NDIMC"], config["KWG"], config["DB"]) == (256, 16, 1)
    assert {"work_group_size_within_device", "local_memory_within_device"} <= set(
        tiled.space(p, small).violations(config))
    assert tiled.space(p, small).is_valid(tiled.default(p, small))
    direct = ALGORITHMS["gemm_direct"]
    config = {**direct.default(p, small), "KSL": 32, "NDIMD": 8, "MDIMD": 4}
    assert "work_group_size_within_device" in direct.space(p, small).violations(config)


def test_run_rejects_layouts_that_do_not_fit(device):
    p = problem((8, 8, 8), (False, False), batch=2)
    plan = ALGORITHMS["gemm_tiled"].build(p, device, ALGORITHMS["gemm_tiled"].default(p, device))
    a, b, c = device.alloc(4 * 128), device.alloc(4 * 128), device.alloc(4 * 128)
    with pytest.raises(ValueError, match="lda=4"):
        plan.run(a, b, c, lda=4)
    with pytest.raises(ValueError, match="buffer a"):
        plan.run(a, b, c, a_offset=1)
    with pytest.raises(ValueError, match="overlap"):
        plan.run(a, b, c, stride_c=8)
    with pytest.raises(ValueError, match="negative"):
        plan.run(a, b, c, b_offset=-1)


# ---- the spaces ----------------------------------------------------------------------------------------


# 4096^3: 82k configs, and 57k more with a stream-K tail (big tiles only)
@pytest.mark.parametrize("spec, low, high", [("4096,4096,4096", 10_000, 150_000),
                                             ("64,1000,2048", 1_000, 80_000)])
def test_tiled_space_on_an_h200_like_device(spec, low, high):
    p = GemmProblem.from_spec(spec)
    space = ALGORITHMS["gemm_tiled"].space(p, H200)
    configs = space.configs()
    assert low <= len(configs) <= high
    assert ALGORITHMS["gemm_tiled"].default(p, H200) in configs


def test_tiled_space_contains_the_fast_h200_shapes():
    """128x128 / 128x256 tiles, 128-256 threads, 8x8 and 16x8 per thread, float4, double buffering."""
    p = GemmProblem(4096, 4096, 4096)
    configs = ALGORITHMS["gemm_tiled"].space(p, H200).configs()
    shapes = [(128, 128, 8, 16), (128, 128, 16, 16), (256, 128, 16, 16), (128, 256, 8, 32)]
    for mwg, nwg, mdimc, ndimc in shapes:
        fast = {"MWG": mwg, "NWG": nwg, "MDIMC": mdimc, "NDIMC": ndimc, "VWA": 4, "VWB": 4, "VWM": 4,
                "VWN": 4, "DB": 1, "SA": 1, "SB": 1}
        matches = [c for c in configs if all(c[k] == v for k, v in fast.items())]
        assert matches, f"no {fast} in the 4096^3 space"
        assert {c["MAXRREG"] for c in matches} > {0} and {c["RWGS"] for c in matches} == {0, 1}
        assert {c["PAD"] for c in matches} == {0, 1} and {c["GM"] for c in matches} == {1, 8}


def test_both_families_are_registered():
    assert {a.name for a in kernels.algorithms("gemm")} >= {"gemm_tiled", "gemm_direct"}
    assert kernels.algorithm("gemm_direct").kind == "gemm"
    assert all(a.applies(GemmProblem(4, 4, 4), H200) for a in ALGORITHMS.values())
    assert not any(a.applies(GemmProblem(4, 4, 4, dtype="float16"), H200) for a in ALGORITHMS.values())


@pytest.mark.parametrize("shape, batch", [((3, 8, 4), 72), ((1, 1, 1), 500), ((2, 2, 2), 4096)])
def test_many_small_batched_matrices_have_a_default(device, rng, shape, batch):
    """Pruning once emptied gemm_tiled's space for tiny batched problems, and default() crashed."""
    m, n, k = shape
    p = GemmProblem(m, n, k, batch=batch)
    tiled = ALGORITHMS["gemm_tiled"]
    config = tiled.default(p, device)
    assert tiled.space(p, device).is_valid(config)
    a = rng.standard_normal((batch, m, k)).astype(np.float32)
    b = rng.standard_normal((batch, k, n)).astype(np.float32)
    c = np.empty((batch, m, n), np.float32)
    ab, bb, cb = device.upload(a), device.upload(b), device.upload(c)
    tiled.build(p, device, config).run(ab, bb, cb)
    np.testing.assert_allclose(device.download(cb, c.shape), a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", ["2,4096,25088,0,1", "2,25088,4096", "4096,2,25088", "1,100000,3"])
@pytest.mark.parametrize("target", ["device", "h200"])
def test_skinny_fc_products_have_a_searched_default(device, spec, target):
    """vgg16's classifier at batch 2 (2x4096x25088) once left gemm_tiled's pruned space empty."""
    p = GemmProblem.from_spec(spec)
    dev = device if target == "device" else H200
    tiled = ALGORITHMS["gemm_tiled"]
    configs = tiled.space(p, dev).configs()
    assert configs and tiled.default(p, dev) in configs


def test_a_kernel_the_device_cannot_launch_at_its_work_group_size_fails_at_build(device, monkeypatch):
    """Where registers cap the work-group size below the config's (CL_KERNEL_WORK_GROUP_SIZE), the plan
    says so when it is built instead of failing every launch."""
    p = problem((64, 64, 64), (False, False))
    config = ALGORITHMS["gemm_tiled"].default(p, device)
    threads = config["MDIMC"] * config["NDIMC"]
    monkeypatch.setattr(device, "kernel_max_threads", lambda kernel: threads // 2)
    with pytest.raises(WorkGroupTooLargeError, match=f"at most {threads // 2} threads per work-group"):
        ALGORITHMS["gemm_tiled"].build(p, device, config)
