"""A GEMM plan run on operands laid out in their buffers, checked against numpy in float64: the layouts
(offsets, leading dimensions, batch strides, broadcasts, alpha and beta), the operands placed with NaN
around them, and the tolerance of the plan's precision. Used by test_gemm_contract.py and the tests of
one family's own features (split K, stream-K, cp.async, the tensor-core layouts).

Tolerance: an output is a sum of K products accumulated in fp32, in an order that depends on the config
(tile depth, unrolling, split K). For random data its rounding error grows like sqrt(K) (K in the worst
case) relative to S = |alpha|·(|op(A)| @ |op(B)|) + |beta|·|C|, the sum of magnitudes, which stays
meaningful under cancellation. The fp32 bound is 8·eps32·sqrt(K)·S, several times the typical error yet
far below what an indexing bug costs: one product lost or counted twice moves an output by about S/K,
which exceeds the bound for every K here. A plan computing at TF32 adds what rounding or truncating the
inputs to TF32 costs (``tunecl.search.harness.tf32_tolerance`` with its value term, as the tuner's
harness verifies such plans); float16 outputs add their one rounding to half
(``tunecl.search.harness.half_output_tolerance``; the half inputs are the reference's exact inputs).
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tunecl.errors import WorkGroupTooLargeError
from tunecl.kernels import split_finish
from tunecl.kernels.gemm import core, gemm_tiled, gemm_pretrans
from tunecl.precision import FP32, TF32, algorithm_precision
from tunecl.problems import GemmProblem
from tunecl.search.harness import gemm_spread, half_output_tolerance, tf32_tolerance

EPS32 = float(np.finfo(np.float32).eps)
GUARD = 5  # elements after the last matrix element, checked untouched in C
TRANSPOSES = [(False, False), (False, True), (True, False), (True, True)]
TRANSPOSE_IDS = ["nn", "nt", "tn", "tt"]
# (M, N, K): every size of 1, 7, 33, 127, 257 in every role
EDGE_SHAPES = [(1, 1, 1), (7, 33, 127), (33, 127, 7), (127, 257, 33), (257, 7, 1), (1, 257, 127), (33, 1, 257),
               (257, 127, 257)]


def gpu_double(*, local_mem: int = 48 * 1024, max_wg: int = 1024, vendor: str = "NVIDIA Corporation",
               units: int = 132, device_type: str = "gpu", capabilities: frozenset[str] | None = None):
    """A stand-in for a device, with the attributes spaces and defaults read (an H200's limits unless
    told otherwise); ``capabilities`` None leaves the attribute out, as a device that has none."""
    fingerprint = types.SimpleNamespace(vendor=vendor, device_type=device_type, compute_units=units)
    device = types.SimpleNamespace(local_mem_size=local_mem, max_work_group_size=max_wg, fingerprint=fingerprint)
    if capabilities is not None:
        device.capabilities = capabilities
    return device


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


# Aligned layouts (offsets, lds, batch strides multiple of 4, of 8 for ALIGNED8) take the vector paths
# (ALIGNED8: the 128-bit ones of half operands), with the matrix edges inside vectors for odd sizes;
# unaligned ones the scalar fallback variant. beta == 0 runs fill C with NaN: C must not be read.
PACKED_NAN_C = Layout()
ALIGNED_NAN_C = Layout(batch=2, alpha=-0.5, offsets=(8, 4, 4), pads=(4, 0, 8), gap=4, align=4)
ALIGNED = Layout(batch=3, alpha=0.75, beta=-1.25, offsets=(4, 8, 12), pads=(4, 8, 4), gap=4, align=4)
ALIGNED8 = Layout(batch=2, alpha=0.75, beta=-1.25, offsets=(8, 16, 8), pads=(8, 0, 8), gap=8, align=8)
UNALIGNED = Layout(batch=2, alpha=-1.5, beta=0.5, offsets=(1, 3, 5), pads=(3, 1, 2), gap=1)
BROADCAST_A = Layout(batch=3, alpha=2.0, beta=1.0, offsets=(0, 4, 0), pads=(0, 0, 4), broadcast="a", align=4)
BROADCAST_B = Layout(batch=2, beta=-0.5, offsets=(3, 0, 1), pads=(1, 0, 0), broadcast="b", gap=3)


def widest_aligned(dtype: str) -> Layout:
    """The aligned layout with beta != 0 whose offsets and lds allow 128-bit loads of ``dtype``."""
    return ALIGNED8 if dtype == "float16" else ALIGNED


def problem(shape: tuple[int, int, int], transposes: tuple[bool, bool], batch: int = 1,
            dtype: str = "float32") -> GemmProblem:
    return GemmProblem(*shape, *transposes, batch=batch, dtype=dtype)


def matrix_view(flat: np.ndarray, offset: int, ld: int, rows: int, cols: int) -> np.ndarray:
    """The rows x cols matrix at ``offset`` with row stride ``ld`` inside ``flat`` (a writable view)."""
    return np.lib.stride_tricks.as_strided(flat[offset:], (rows, cols), (ld * flat.itemsize, flat.itemsize))


def place(rng: np.random.Generator, batch: int, rows: int, cols: int, offset: int, ld: int, stride: int,
          fill: float | None = None, outside: float | None = np.nan,
          dtype: Any = np.float32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A flat ``dtype`` buffer with ``batch`` random (or ``fill``) matrices at ``offset + b * stride``.

    Elements outside the matrices hold ``outside`` (random if None): NaN makes any read of them show.
    Returns (flat buffer, the matrices as placed (batch x rows x cols), mask of the matrix elements).
    """
    size = offset + (batch - 1) * stride + (rows - 1) * ld + cols + GUARD
    flat = (rng.standard_normal(size) if outside is None else np.full(size, outside)).astype(dtype)
    mask = np.zeros(size, dtype=bool)
    for b in range(batch):
        view = matrix_view(flat, offset + b * stride, ld, rows, cols)
        if b == 0 or stride:
            view[...] = rng.standard_normal((rows, cols)) if fill is None else fill
        matrix_view(mask, offset + b * stride, ld, rows, cols)[...] = True
    mats = np.stack([matrix_view(flat, offset + b * stride, ld, rows, cols) for b in range(batch)])
    return flat, mats, mask


def check_run(device, algorithm, p: GemmProblem, config, layout: Layout, rng, *,
              build: Callable[..., Any] | None = None, workspace: int | None = None,
              expect_tf32: bool = False) -> None:
    """Build ``config`` for ``p`` (``build(p, device, config)``, by default ``algorithm.build``), run it on
    operands laid out as ``layout`` and compare with numpy in float64 within the tolerance of the plan's
    precision (module docstring); C's elements outside its matrices must be left as they were.

    The plan must name ``algorithm``, ``p`` and ``config`` (with the parameters the space implies) and
    compute at the precision ``algorithm`` declares; ``workspace``: the bytes it must hold besides the
    operands. ``expect_tf32``: some output must also miss the fp32 bound (the inputs really were
    reduced to TF32).
    """
    plan = (build or algorithm.build)(p, device, config)
    precision = getattr(plan, "precision", FP32)
    assert (plan.algorithm, plan.problem, precision) == (algorithm.name, p, algorithm_precision(algorithm))
    assert plan.config == {**plan.config, **config}, (plan.config, config)
    if workspace is not None:
        assert plan.workspace_bytes == workspace, (plan.workspace_bytes, workspace)
    dtype = np.dtype(p.dtype)
    shape_a = (p.k, p.m) if p.trans_a else (p.m, p.k)
    shape_b = (p.n, p.k) if p.trans_b else (p.k, p.n)
    lds = (layout.ld(0, shape_a[1]), layout.ld(1, shape_b[1]), layout.ld(2, p.n))
    strides = [shape_a[0] * lds[0] + layout.gap, shape_b[0] * lds[1] + layout.gap, p.m * lds[2] + layout.gap]
    if layout.broadcast:
        strides["ab".index(layout.broadcast)] = 0
    a_flat, a_mats, _ = place(rng, p.batch, *shape_a, layout.offsets[0], lds[0], strides[0], dtype=dtype)
    b_flat, b_mats, _ = place(rng, p.batch, *shape_b, layout.offsets[1], lds[1], strides[1], dtype=dtype)
    c_flat, c_mats, c_mask = place(rng, p.batch, p.m, p.n, layout.offsets[2], lds[2], strides[2],
                                   fill=np.nan if layout.beta == 0 else None, outside=None, dtype=dtype)
    a_buf, b_buf, c_buf = device.upload(a_flat), device.upload(b_flat), device.upload(c_flat)
    names = ("a_offset", "b_offset", "c_offset", "lda", "ldb", "ldc", "stride_a", "stride_b", "stride_c")
    layout_args = {} if layout.packed else dict(zip(names, (*layout.offsets, *lds, *strides), strict=True))
    events = plan.run(a_buf, b_buf, c_buf, alpha=layout.alpha, beta=layout.beta, **layout_args)
    assert isinstance(events, list) and events, "run must return the events it enqueued"
    events[-1].wait()
    out_flat = device.download(c_buf, c_flat.shape, dtype)

    op_a = a_mats.astype(np.float64).transpose(0, 2, 1) if p.trans_a else a_mats.astype(np.float64)
    op_b = b_mats.astype(np.float64).transpose(0, 2, 1) if p.trans_b else b_mats.astype(np.float64)
    product = op_a @ op_b
    ref = layout.alpha * product
    scale = abs(layout.alpha) * (np.abs(op_a) @ np.abs(op_b))
    if layout.beta != 0:
        ref += layout.beta * c_mats.astype(np.float64)
        scale += abs(layout.beta) * np.abs(c_mats.astype(np.float64))
    out = np.stack([matrix_view(out_flat, layout.offsets[2] + b * strides[2], lds[2], p.m, p.n)
                    for b in range(p.batch)]).astype(np.float64)
    fp32_tolerance = 8 * EPS32 * math.sqrt(p.k) * scale
    tolerance = fp32_tolerance
    if precision == TF32:
        tolerance = tolerance + abs(layout.alpha) * tf32_tolerance(gemm_spread(op_a, op_b), product)
    if p.dtype == "float16":
        tolerance = half_output_tolerance(ref, tolerance)
    error = np.abs(out - ref)
    bad = ~(error <= tolerance)  # NaN counts as bad
    where = f"{algorithm.name} {p.key} {layout} config={config}"
    assert not bad.any(), (f"{bad.sum()} of {bad.size} outputs wrong, first at {np.argwhere(bad)[0]}: "
                           f"{out[bad][0]} vs {ref[bad][0]}; {where}")
    bits = np.dtype(f"u{dtype.itemsize}")
    np.testing.assert_array_equal(out_flat[~c_mask].view(bits), c_flat[~c_mask].view(bits),
                                  err_msg=f"wrote outside C: {where}")
    if expect_tf32:
        assert (error > fp32_tolerance).any(), f"no output shows TF32 rounding: {where}"


def tiled_workspace(device, p: GemmProblem, config) -> int:
    """The bytes a gemm_tiled plan of ``config`` holds besides the operands: the split-K slices (and, where
    the kernel finishes the split itself, a counter per C tile after them), the stream-K parts (two MWG x NWG tiles per stream-K work-group, if the last wave is part-filled) and
    the transposed copies ASYNC makes of an operand stored the other way."""
    splitk = config.get("SPLITK", 1)
    workspace = 4 * splitk * p.batch * p.m * core.workspace_ld(p.n) if splitk > 1 else 0
    if splitk > 1 and gemm_tiled.FINISH_SPLITS and split_finish.finishes(device):
        workspace += 4 * -(-p.m // config["MWG"]) * -(-p.n // config["NWG"]) * p.batch
    if config.get("STREAMK"):
        tiles = -(-p.m // config["MWG"]) * -(-p.n // config["NWG"]) * p.batch
        groups = config["STREAMK"] * gemm_tiled.compute_units(device)   # (gemm_tiled reads compute_units: tests patch it there)
        workspace += 4 * 2 * groups * config["MWG"] * config["NWG"] if tiles % groups else 0
    layout = gemm_pretrans.with_layout(p, *gemm_tiled.kernel_layout(p, config))
    return workspace + 4 * sum(gemm_pretrans.workspace_words(p, layout))


def check_tiled_run(device, algorithm, p: GemmProblem, config, layout: Layout, rng) -> None:
    """``check_run`` of a gemm_tiled config (``algorithm``: gemm_tiled, or a stand-in that builds it
    emulated), whose plan must hold exactly ``tiled_workspace``."""
    check_run(device, algorithm, p, config, layout, rng, workspace=tiled_workspace(device, p, config))


def check_launchable_draw(draw: Callable[[int, int], tuple[Any, Any]], index: int,
                          check: Callable[[Any, Any], None]) -> None:
    """``check(transposes, config)`` on draw ``index`` (``draw(index, attempt)``); where this device
    cannot launch the config at its work-group size (a GPU's registers), on the next draw instead, as
    the tuner passes over it."""
    refused = []
    for attempt in range(6):
        transposes, config = draw(index, attempt)
        try:
            check(transposes, config)
            return
        except WorkGroupTooLargeError as error:
            refused.append(str(error))
    pytest.skip("this device cannot launch any of the drawn configs: " + "; ".join(refused))
