"""``conv_im2col``: convolution through an explicit column matrix in the plan's workspace and the GEMM
family's ``gemm_tiled`` plan (data movement in ``conv_im2col.cl``).

    fwd         im2col(x) → col (C·R·S × P·Q per image);   y[n, g] = w_g · col[n, g]
    bwd_data    col[n, g] = w_gᵀ · dy[n, g];                 dx = col2im(col)  (a gather: no atomics)
    bwd_weight  im2col(x);  partial[n]_g = dy[n, g] · col[n, g]ᵀ;  dw = Σ_n partial[n] (fixed order)

Images go through in chunks (the largest divisor of N whose workspace fits ``WORKSPACE_CAP``), so
every chunk runs the same GEMM; the GEMM's batch runs over the chunk's images (or over the groups when
there are more groups than images). bwd_weight's batch of per-image GEMMs gives the device parallel
work that one GEMM over the long N·P·Q reduction would not; ``split_reduce`` adds the partial
gradients in a fixed order, and later chunks accumulate with β = 1. The forward bias is a small extra
kernel (the GEMM does not fuse it).

Applies to every fp32 problem while ``gemm_tiled`` is registered and one image's columns fit the cap.
Parameters: IWG (work-items per work-group) and IPT (pixels per work-item) of the im2col / col2im
kernels, and ``gemm_tiled``'s own parameters prefixed ``g_`` (``g_MWG``, ``g_NWG``, ...), searched
in that GEMM's space for the sub-problem this convolution hands it.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pyopencl as cl

from tunecl.kernels.base import Config, Constraint
from tunecl.kernels.conv_common import (FLOAT_BYTES, GemmBackedAlgorithm, GemmBackedPlan, OwnSpace, add_bias,
                                        is_gpu, max_group_size, split_gemm_config, supported)
from tunecl.kernels.sizes import ceil_div, round_up
from tunecl.problems import ConvProblem, GemmProblem
from tunecl.runtime import Device

WORKSPACE_CAP = 256 * 2**20   # bytes of column matrices a plan may hold


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a problem maps onto the workspace and the GEMM (all sizes in elements)."""

    chunk: int            # images per pass (divides N)
    col_ld: int           # row stride of the column matrices (P·Q padded to 4 for vector loads)
    col_image: int        # elements between two images' column matrices (C·R·S·col_ld)
    col_floats: int       # workspace elements of the chunk's column matrices
    partial_floats: int   # workspace elements of per-image partial weight gradients (bwd_weight)
    over_groups: bool     # the GEMM batch runs over the groups (else over the chunk's images)
    gemm: GemmProblem


@functools.lru_cache(maxsize=256)
def layout(problem: ConvProblem) -> Layout | None:
    """The workspace layout and GEMM of ``problem``; None if one image's columns exceed the cap."""
    p = problem
    g = p.groups
    cg, kg, rs, pq = p.c // g, p.k // g, p.r * p.s, p.p * p.q
    ld = round_up(pq, 4)
    per_image = p.c * rs * ld + (p.k * cg * rs if p.direction == "bwd_weight" else 0)
    chunk = max((d for d in range(1, p.n + 1)
                 if p.n % d == 0 and d * per_image * FLOAT_BYTES <= WORKSPACE_CAP), default=0)
    if not chunk:
        return None
    over_groups = g > chunk
    batch = g if over_groups else chunk
    partial = chunk * p.k * cg * rs if p.direction == "bwd_weight" and chunk > 1 else 0
    if p.direction == "fwd":
        gemm = GemmProblem(kg, pq, cg * rs, batch=batch)
    elif p.direction == "bwd_data":
        gemm = GemmProblem(cg * rs, pq, kg, trans_a=True, batch=batch)
    else:
        gemm = GemmProblem(kg, cg * rs, pq, trans_b=True, batch=batch)
    return Layout(chunk, ld, p.c * rs * ld, chunk * p.c * rs * ld, partial, over_groups, gemm)


class ConvIm2col(GemmBackedAlgorithm):
    """Explicit im2col / col2im + ``gemm_tiled``; see the module docstring."""

    name = "conv_im2col"
    version = 1
    source_file = "conv_im2col.cl"

    def gemm_problem(self, problem: ConvProblem) -> GemmProblem | None:
        plan_layout = layout(problem)
        return None if plan_layout is None else plan_layout.gemm

    def applies(self, problem: ConvProblem, device: Device) -> bool:
        if problem.kind != "conv" or not supported(problem) or not self.gemm_applies(problem, device):
            return False
        plan_layout = layout(problem)
        return (plan_layout.col_floats + plan_layout.partial_floats) * FLOAT_BYTES <= device.max_alloc_size

    def own_space(self, problem: ConvProblem, device: Device) -> OwnSpace:
        limit_wg = max_group_size(device)
        return ({"IWG": (64, 256), "IPT": (1, 4)},
                [Constraint("work_group_size", lambda c: c["IWG"] <= limit_wg)])

    def own_default(self, problem: ConvProblem, device: Device) -> Config:
        own = {"IWG": 256, "IPT": 1} if is_gpu(device) else {"IWG": 64, "IPT": 4}
        if own["IWG"] > max_group_size(device):
            own["IWG"] = 64
        return own

    def build(self, problem: ConvProblem, device: Device, config: Config) -> Im2colPlan:
        self.check(problem, device, config)
        own, _ = split_gemm_config(config)
        lay = layout(problem)
        p = problem
        options = [f"-DCHUNK_N={lay.chunk}", f"-DCOL_LD={lay.col_ld}"]
        program = self.program(device, problem, own, options)
        i32, f32 = np.int32, np.float32
        kernels: dict[str, cl.Kernel] = {}
        if p.direction in ("fwd", "bwd_weight"):
            kernels["im2col"] = device.kernel(program, "im2col", [None, i32, i32, None, i32])
        if p.direction == "bwd_data":
            kernels["col2im"] = device.kernel(program, "col2im", [None, None, i32, i32, f32])
        gemm_plan = self.build_gemm(problem, device, config)
        workspace = (lay.col_floats + lay.partial_floats) * FLOAT_BYTES
        return Im2colPlan(self.name, dict(config), problem, device, workspace, kernels=kernels,
                          gemm_plan=gemm_plan, layout=lay)


@dataclasses.dataclass
class Im2colPlan(GemmBackedPlan):
    """Per chunk of images: the gather kernel(s), the GEMM launches, then col2im (bwd_data)."""

    kernels: dict[str, cl.Kernel] = dataclasses.field(default_factory=dict)
    layout: Layout | None = None

    def _pixels_grid(self, pixels: int, rows: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        iwg, ipt = self.config["IWG"], self.config["IPT"]
        return (ceil_div(pixels, iwg * ipt) * iwg, rows, self.layout.chunk), (iwg, 1, 1)

    def enqueue(self, a: cl.Buffer, b: cl.Buffer, out: cl.Buffer, a_offset: int, b_offset: int,
                out_offset: int, bias: cl.Buffer | None, bias_offset: int, beta: float,
                wait_for: list[cl.Event] | None) -> list[cl.Event]:
        p, lay, ws = self.problem, self.layout, self.workspace
        g = p.groups
        cg, kg, rs, pq = p.c // g, p.k // g, p.r * p.s, p.p * p.q
        gemm, device = self.gemm_plan, self.device
        events: list[cl.Event] = []

        def waits() -> list[cl.Event] | None:
            # the queue is in order: only the first command needs the caller's events
            return None if events else wait_for

        for n0 in range(0, p.n, lay.chunk):
            if p.direction == "fwd":
                glob, loc = self._pixels_grid(pq, p.c * rs)
                events.append(device.launch(self.kernels["im2col"], glob, loc, a, a_offset, n0, ws, 0,
                                            wait_for=waits()))
                for i in range(lay.chunk if lay.over_groups else g):
                    if lay.over_groups:     # image n0+i, batch over groups
                        offsets = {"a_offset": b_offset, "stride_a": kg * cg * rs,
                                   "b_offset": i * lay.col_image, "stride_b": cg * rs * lay.col_ld,
                                   "c_offset": out_offset + (n0 + i) * p.k * pq, "stride_c": kg * pq}
                    else:                   # group i, batch over the chunk's images
                        offsets = {"a_offset": b_offset + i * kg * cg * rs, "stride_a": 0,
                                   "b_offset": i * cg * rs * lay.col_ld, "stride_b": lay.col_image,
                                   "c_offset": out_offset + n0 * p.k * pq + i * kg * pq,
                                   "stride_c": p.k * pq}
                    events += gemm.run(b, ws, out, beta=beta, ldb=lay.col_ld, ldc=pq, **offsets)
            elif p.direction == "bwd_data":
                for i in range(lay.chunk if lay.over_groups else g):
                    if lay.over_groups:     # image n0+i, batch over groups
                        offsets = {"a_offset": b_offset, "stride_a": kg * cg * rs,
                                   "b_offset": a_offset + (n0 + i) * p.k * pq, "stride_b": kg * pq,
                                   "c_offset": i * lay.col_image, "stride_c": cg * rs * lay.col_ld}
                    else:                   # group i, batch over the chunk's images
                        offsets = {"a_offset": b_offset + i * kg * cg * rs, "stride_a": 0,
                                   "b_offset": a_offset + n0 * p.k * pq + i * kg * pq, "stride_b": p.k * pq,
                                   "c_offset": i * cg * rs * lay.col_ld, "stride_c": lay.col_image}
                    events += gemm.run(b, a, ws, ldb=pq, ldc=lay.col_ld, wait_for=waits(), **offsets)
                glob, loc = self._pixels_grid(p.h * p.w, p.c)
                events.append(device.launch(self.kernels["col2im"], glob, loc, ws, out, out_offset, n0,
                                            beta))
            else:
                pass_beta = beta if n0 == 0 else 1.0   # later chunks accumulate onto the earlier ones
                col = lay.partial_floats                 # the columns sit after the partial sums
                glob, loc = self._pixels_grid(pq, p.c * rs)
                events.append(device.launch(self.kernels["im2col"], glob, loc, a, a_offset, n0, ws, col,
                                            wait_for=waits()))
                direct = lay.chunk == 1   # one image per pass: accumulate straight into dw
                c_buf, c_base, c_image = (out, out_offset, 0) if direct else (ws, 0, p.k * cg * rs)
                for i in range(lay.chunk if lay.over_groups else g):
                    if lay.over_groups:     # image n0+i, batch over groups
                        offsets = {"a_offset": b_offset + (n0 + i) * p.k * pq, "stride_a": kg * pq,
                                   "b_offset": col + i * lay.col_image, "stride_b": cg * rs * lay.col_ld,
                                   "c_offset": c_base + i * c_image, "stride_c": kg * cg * rs}
                    else:                   # group i, batch over the chunk's images
                        offsets = {"a_offset": b_offset + n0 * p.k * pq + i * kg * pq, "stride_a": p.k * pq,
                                   "b_offset": col + i * cg * rs * lay.col_ld, "stride_b": lay.col_image,
                                   "c_offset": c_base + i * kg * cg * rs, "stride_c": c_image}
                    events += gemm.run(b, ws, c_buf, beta=pass_beta if direct else 0.0, lda=pq,
                                       ldb=lay.col_ld, ldc=cg * rs, **offsets)
                if not direct:
                    events.append(self.split_reduce(out, out_offset, lay.chunk, None, 0, pass_beta, None))
        if bias is not None:
            events.append(add_bias(self, out, out_offset, bias, bias_offset, None))
        return events


ALGORITHMS = [ConvIm2col()]
