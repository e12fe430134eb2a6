"""``conv_1x1``: 1×1 convolutions (padding 0, any stride, dilation and groups) as GEMMs of the GEMM
family's ``gemm_tiled``, with the strided data movement in ``conv_1x1.cl``.

Per image n and group g, with X = x[n, g] as a C/G × H·W matrix and Y = y[n, g] as K/G × P·Q:

    fwd         Y = W_g · X                 stride 1: straight from x into y, no copy
    bwd_data    dX = W_gᵀ · dY              stride 1: straight into dx (β folded into the GEMM)
    bwd_weight  dW_g = Σ_n dY · Xᵀ          one batched GEMM per chunk of images writes a partial dW
                                            per image; ``split_reduce`` adds them in a fixed order

With stride > 1 the input pixels on the stride grid are first gathered into the workspace (fwd,
bwd_weight), and bwd_data scatters its GEMM result onto the grid of dx, with zeros between. Images
go in chunks whose workspace fits ``WORKSPACE_CAP``; the GEMM's batch runs over the chunk's images, or
over the groups when there are more groups than images. The forward bias is a small extra kernel.

Parameters: IWG, IPT (gather / scatter work-group size and pixels per work-item; only with stride
> 1) and ``gemm_tiled``'s own parameters prefixed ``g_``.
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

WORKSPACE_CAP = 256 * 2**20   # bytes of gathered images and partial weight gradients a plan may hold


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a 1×1 problem maps onto the workspace and the GEMM (sizes in elements)."""

    strided: bool         # stride > 1: pixels go through the workspace
    chunk: int            # images per pass (divides N)
    ld: int               # row stride of a gathered image (P·Q padded to 4)
    gathered_floats: int  # workspace of the gathered (fwd, bwd_weight) or GEMM-written (bwd_data) images
    partial_floats: int   # workspace of the per-image partial weight gradients (bwd_weight, chunk > 1)
    over_groups: bool     # the GEMM batch runs over the groups (else over the chunk's images)
    gemm: GemmProblem


@functools.lru_cache(maxsize=256)
def layout(problem: ConvProblem) -> Layout | None:
    """The workspace layout and GEMM of a 1×1 problem; None when it does not fit the cap."""
    p = problem
    g = p.groups
    cg, kg, pq = p.c // g, p.k // g, p.p * p.q
    strided = p.stride != (1, 1)
    ld = round_up(pq, 4)
    per_image = p.c * ld if strided else 0
    if p.direction == "bwd_weight":
        per_image += p.k * cg   # one partial dW per image of the chunk

    def fits(d: int) -> bool:
        return d * per_image * FLOAT_BYTES <= WORKSPACE_CAP

    chunk = max((d for d in range(1, p.n + 1) if p.n % d == 0 and fits(d)), default=0)
    if not chunk:
        return None
    over_groups = g > chunk
    batch = g if over_groups else chunk
    gathered = chunk * p.c * ld if strided else 0
    partial = chunk * p.k * cg if p.direction == "bwd_weight" and chunk > 1 else 0
    if p.direction == "fwd":
        gemm = GemmProblem(kg, pq, cg, batch=batch)
    elif p.direction == "bwd_data":
        gemm = GemmProblem(cg, pq, kg, trans_a=True, batch=batch)
    else:
        gemm = GemmProblem(kg, cg, pq, trans_b=True, batch=batch)
    return Layout(strided, chunk, ld, gathered, partial, over_groups, gemm)


class Conv1x1(GemmBackedAlgorithm):
    """1×1 convolution as GEMM; see the module docstring."""

    name = "conv_1x1"
    version = 1
    source_file = "conv_1x1.cl"

    def gemm_problem(self, problem: ConvProblem) -> GemmProblem | None:
        plan_layout = layout(problem)
        return None if plan_layout is None else plan_layout.gemm

    def applies(self, problem: ConvProblem, device: Device) -> bool:
        if (problem.kind != "conv" or not supported(problem) or (problem.r, problem.s) != (1, 1)
                or problem.padding != (0, 0) or not self.gemm_applies(problem, device)):
            return False
        lay = layout(problem)
        return (lay.gathered_floats + lay.partial_floats) * FLOAT_BYTES <= device.max_alloc_size

    def own_space(self, problem: ConvProblem, device: Device) -> OwnSpace:
        if problem.stride == (1, 1):
            return {}, []
        limit_wg = max_group_size(device)
        return ({"IWG": (64, 256), "IPT": (1, 4)},
                [Constraint("work_group_size", lambda c: c["IWG"] <= limit_wg)])

    def own_default(self, problem: ConvProblem, device: Device) -> Config:
        if problem.stride == (1, 1):
            return {}
        own = {"IWG": 256, "IPT": 1} if is_gpu(device) else {"IWG": 64, "IPT": 4}
        if own["IWG"] > max_group_size(device):
            own["IWG"] = 64
        return own

    def build(self, problem: ConvProblem, device: Device, config: Config) -> Conv1x1Plan:
        self.check(problem, device, config)
        own, _ = split_gemm_config(config)
        lay = layout(problem)
        kernels: dict[str, cl.Kernel] = {}
        if lay.strided:
            program = self.program(device, problem, own, [f"-DCHUNK_N={lay.chunk}", f"-DLD={lay.ld}"])
            i32, f32 = np.int32, np.float32
            if problem.direction == "bwd_data":
                kernels["scatter"] = device.kernel(program, "scatter_strided", [None, None, i32, i32, f32])
            else:
                kernels["gather"] = device.kernel(program, "gather_strided", [None, i32, i32, None, i32])
        workspace = (lay.gathered_floats + lay.partial_floats) * FLOAT_BYTES
        return Conv1x1Plan(self.name, dict(config), problem, device, workspace, kernels=kernels,
                           gemm_plan=self.build_gemm(problem, device, config), layout=lay)


@dataclasses.dataclass
class Conv1x1Plan(GemmBackedPlan):
    """Per chunk of images: gather (stride > 1), the GEMM launches, then scatter or reduce."""

    kernels: dict[str, cl.Kernel] = dataclasses.field(default_factory=dict)
    layout: Layout | None = None

    def _grid(self, pixels: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        iwg, ipt = self.config["IWG"], self.config["IPT"]
        return (ceil_div(pixels, iwg * ipt) * iwg, self.problem.c, self.layout.chunk), (iwg, 1, 1)

    def enqueue(self, a: cl.Buffer, b: cl.Buffer, out: cl.Buffer, a_offset: int, b_offset: int,
                out_offset: int, bias: cl.Buffer | None, bias_offset: int, beta: float,
                wait_for: list[cl.Event] | None) -> list[cl.Event]:
        p, lay, ws, device, gemm = self.problem, self.layout, self.workspace, self.device, self.gemm_plan
        g = p.groups
        cg, kg, hw, pq = p.c // g, p.k // g, p.h * p.w, p.p * p.q
        events: list[cl.Event] = []

        def waits() -> list[cl.Event] | None:
            # the queue is in order: only the first command needs the caller's events
            return None if events else wait_for

        for n0 in range(0, p.n, lay.chunk):
            if p.direction == "fwd":
                if lay.strided:   # B = the gathered pixels of the chunk
                    glob, loc = self._grid(pq)
                    events.append(device.launch(self.kernels["gather"], glob, loc, a, a_offset, n0, ws, 0,
                                                wait_for=waits()))
                    x_buf, x_base, x_image, ldx = ws, 0, p.c * lay.ld, lay.ld
                else:             # B = x itself
                    x_buf, x_base, x_image, ldx = a, a_offset + n0 * p.c * hw, p.c * hw, hw
                for i in range(lay.chunk if lay.over_groups else g):
                    if lay.over_groups:     # image n0+i, batch over groups
                        offsets = {"a_offset": b_offset, "stride_a": kg * cg,
                                   "b_offset": x_base + i * x_image, "stride_b": cg * ldx,
                                   "c_offset": out_offset + (n0 + i) * p.k * pq, "stride_c": kg * pq}
                    else:                   # group i, batch over the chunk's images
                        offsets = {"a_offset": b_offset + i * kg * cg, "stride_a": 0,
                                   "b_offset": x_base + i * cg * ldx, "stride_b": x_image,
                                   "c_offset": out_offset + n0 * p.k * pq + i * kg * pq, "stride_c": p.k * pq}
                    events += gemm.run(b, x_buf, out, beta=beta, ldb=ldx, ldc=pq, wait_for=waits(), **offsets)
            elif p.direction == "bwd_data":
                if lay.strided:   # C = the workspace, scattered afterwards
                    c_buf, c_base, c_image, ldc, gemm_beta = ws, 0, p.c * lay.ld, lay.ld, 0.0
                else:             # C = dx itself
                    c_buf, c_base, c_image, ldc, gemm_beta = out, out_offset + n0 * p.c * hw, p.c * hw, hw, beta
                for i in range(lay.chunk if lay.over_groups else g):
                    if lay.over_groups:
                        offsets = {"a_offset": b_offset, "stride_a": kg * cg,
                                   "b_offset": a_offset + (n0 + i) * p.k * pq, "stride_b": kg * pq,
                                   "c_offset": c_base + i * c_image, "stride_c": cg * ldc}
                    else:
                        offsets = {"a_offset": b_offset + i * kg * cg, "stride_a": 0,
                                   "b_offset": a_offset + n0 * p.k * pq + i * kg * pq, "stride_b": p.k * pq,
                                   "c_offset": c_base + i * cg * ldc, "stride_c": c_image}
                    events += gemm.run(b, a, c_buf, beta=gemm_beta, ldb=pq, ldc=ldc, wait_for=waits(),
                                       **offsets)
                if lay.strided:
                    glob, loc = self._grid(hw)
                    events.append(device.launch(self.kernels["scatter"], glob, loc, ws, out, out_offset, n0,
                                                beta))
            else:
                pass_beta = beta if n0 == 0 else 1.0   # later chunks accumulate onto the earlier ones
                if lay.strided:   # the gathered pixels sit after the partial sums
                    glob, loc = self._grid(pq)
                    events.append(device.launch(self.kernels["gather"], glob, loc, a, a_offset, n0, ws,
                                                lay.partial_floats, wait_for=waits()))
                    x_buf, x_base, x_image, ldx = ws, lay.partial_floats, p.c * lay.ld, lay.ld
                else:
                    x_buf, x_base, x_image, ldx = a, a_offset + n0 * p.c * hw, p.c * hw, hw
                direct = lay.chunk == 1   # one image per pass: accumulate straight into dw
                c_buf, c_base, c_image = (out, out_offset, 0) if direct else (ws, 0, p.k * cg)
                for i in range(lay.chunk if lay.over_groups else g):
                    if lay.over_groups:
                        offsets = {"a_offset": b_offset + (n0 + i) * p.k * pq, "stride_a": kg * pq,
                                   "b_offset": x_base + i * x_image, "stride_b": cg * ldx,
                                   "c_offset": c_base + i * c_image, "stride_c": kg * cg}
                    else:
                        offsets = {"a_offset": b_offset + n0 * p.k * pq + i * kg * pq, "stride_a": p.k * pq,
                                   "b_offset": x_base + i * cg * ldx, "stride_b": x_image,
                                   "c_offset": c_base + i * kg * cg, "stride_c": c_image}
                    events += gemm.run(b, x_buf, c_buf, beta=pass_beta if direct else 0.0, lda=pq, ldb=ldx,
                                       ldc=cg, wait_for=waits(), **offsets)
                if not direct:
                    events.append(self.split_reduce(out, out_offset, lay.chunk, None, 0, pass_beta, None))
        if bias is not None:
            events.append(add_bias(self, out, out_offset, bias, bias_offset, None))
        return events


ALGORITHMS = [Conv1x1()]
