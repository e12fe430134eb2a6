"""What ``conv_1x1`` and ``conv_im2col`` share: a convolution as GEMMs of the GEMM family over the
input's columns (C/G·R·S rows of P·Q pixels per group), a chunk of images at a time.

The columns go through the workspace (a gather kernel for fwd and bwd_weight, a scatter kernel after
bwd_data's GEMMs) or, for a 1×1 stride-1 problem, the GEMMs read x and write dx where they lie. The
GEMM's batch runs over the chunk's images, or over the groups when there are more groups than images;
bwd_weight with several images per chunk writes a partial dW per image that ``split_reduce`` adds in a
fixed order; on ``gemm_tiled`` with the batch over the images, where the device passes the split-finish
probe (:mod:`tunecl.kernels.split_finish`), the GEMM's own launch adds them instead (``SUM_BATCH``: its
last work-group of each dW tile, the same sums in the same order; :data:`FINISH_SPLITS`). The family's own
parameters are those of the gather / scatter kernels: IWG, IPT (work-group size and pixels per
work-item).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyopencl as cl

from tunecl.kernels import split_finish
from tunecl.kernels.base import Config, Constraint
from tunecl.kernels.conv.conv_common import (FLOAT_BYTES, GemmBackedAlgorithm, GemmBackedPlan, OwnSpace,
                                             add_bias, image_chunk, is_gpu, max_group_size, split_gemm_config)
from tunecl.kernels.sizes import ceil_div, round_up
from tunecl.problems import ConvProblem, GemmProblem
from tunecl.runtime import Device

# True: bwd_weight's partial dW per image are added by the GEMM's launch where it can (gemm_tiled, batch over
# the images, the device passing the split-finish probe). False: always by ``split_reduce``'s launch.
FINISH_SPLITS = True


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a problem maps onto the workspace and the GEMM (sizes in elements)."""

    gathers: bool         # the columns go through the workspace (else the GEMMs read x / write dx)
    chunk: int            # images per pass (divides N)
    rows: int             # column rows per group: C/G·R·S
    ld: int               # row stride of the columns in the workspace (P·Q padded to 4 for vector loads)
    image: int            # elements between two images' columns in the workspace (C·R·S·ld)
    gathered_floats: int  # workspace of the chunk's columns (gathered, or written by bwd_data's GEMMs)
    partial_floats: int   # workspace of the per-image partial weight gradients (bwd_weight, chunk > 1)
    over_groups: bool     # the GEMM batch runs over the groups (else over the chunk's images)
    gemm: GemmProblem

    @property
    def workspace_floats(self) -> int:
        return self.gathered_floats + self.partial_floats


def columns_layout(problem: ConvProblem, rs: int, gathers: bool, cap: int) -> Layout | None:
    """The layout of ``problem`` with ``rs`` filter taps per channel, its columns in the workspace or not
    (``gathers``); None when one image's workspace exceeds ``cap`` bytes."""
    p = problem
    g = p.groups
    cg, kg, pq = p.c // g, p.k // g, p.p * p.q
    rows = cg * rs
    ld = round_up(pq, 4)
    per_image = (p.c * rs * ld if gathers else 0) + (p.k * rows if p.direction == "bwd_weight" else 0)
    chunk = image_chunk(p.n, lambda d: d * per_image * FLOAT_BYTES <= cap)
    if not chunk:
        return None
    over_groups = g > chunk
    batch = g if over_groups else chunk
    gathered = chunk * p.c * rs * ld if gathers else 0
    partial = chunk * p.k * rows if p.direction == "bwd_weight" and chunk > 1 else 0
    if p.direction == "fwd":
        gemm = GemmProblem(kg, pq, rows, batch=batch)
    elif p.direction == "bwd_data":
        gemm = GemmProblem(rows, pq, kg, trans_a=True, batch=batch)
    else:
        gemm = GemmProblem(kg, rows, pq, trans_b=True, batch=batch)
    return Layout(gathers, chunk, rows, ld, p.c * rs * ld, gathered, partial, over_groups, gemm)


class ColumnsAlgorithm(GemmBackedAlgorithm):
    """A family whose :meth:`layout` is a :func:`columns_layout`: the algorithm ``name``, whose
    ``source_file`` defines the gather and scatter kernels ``kernel_names``, with the columns' row
    stride as ``-D{ld_option}``."""

    def __init__(self, name: str, source_file: str, kernel_names: tuple[str, str], ld_option: str):
        self.name, self.source_file = name, source_file
        self.kernel_names, self.ld_option = kernel_names, ld_option

    def gathers(self, problem: ConvProblem) -> bool:
        """Whether ``problem``'s columns go through the workspace (then the family has parameters)."""
        return True

    def own_space(self, problem: ConvProblem, device: Device) -> OwnSpace:
        if not self.gathers(problem):
            return {}, []
        limit_wg = max_group_size(device)
        return ({"IWG": (64, 256), "IPT": (1, 4)},
                [Constraint("work_group_size", lambda c: c["IWG"] <= limit_wg)])

    def own_default(self, problem: ConvProblem, device: Device) -> Config:
        if not self.gathers(problem):
            return {}
        own = {"IWG": 256, "IPT": 1} if is_gpu(device) else {"IWG": 64, "IPT": 4}
        if own["IWG"] > max_group_size(device):
            own["IWG"] = 64
        return own

    def build(self, problem: ConvProblem, device: Device, config: Config) -> ColumnsPlan:
        self.check(problem, device, config)
        own, _ = split_gemm_config(config)
        lay = self.layout(problem)
        kernels: dict[str, cl.Kernel] = {}
        if lay.gathers:
            options = [f"-DCHUNK_N={lay.chunk}", f"-D{self.ld_option}={lay.ld}"]
            program = self.program(device, problem, own, options)
            i32, f32 = np.int32, np.float32
            gather, scatter = self.kernel_names
            if problem.direction == "bwd_data":
                kernels["scatter"] = device.kernel(program, scatter, [None, None, i32, i32, f32])
            else:
                kernels["gather"] = device.kernel(program, gather, [None, i32, i32, None, i32])
        # (a GEMM config that cannot sum the batch builds its ordinary plan)
        gemm = self.build_gemm(problem, device, config,
                               **({"sum_batch": True} if self.sums_images(problem, lay, device) else {}))
        if getattr(gemm, "sum_batch", False):   # the GEMM holds the partials: columns at the start
            return ColumnsPlan(self.name, dict(config), problem, device, lay.gathered_floats * FLOAT_BYTES,
                               kernels=kernels, gemm_plan=gemm, layout=lay, sums_images=True)
        return ColumnsPlan(self.name, dict(config), problem, device, lay.workspace_floats * FLOAT_BYTES,
                           kernels=kernels, gemm_plan=gemm, layout=lay)

    def sums_images(self, problem: ConvProblem, lay: Layout, device: Device) -> bool:
        """Whether ``problem``'s partial weight gradients per image may be added by the GEMM's launch."""
        return (problem.direction == "bwd_weight" and lay.chunk > 1 and not lay.over_groups and FINISH_SPLITS
                and self.gemm_name == "gemm_tiled" and split_finish.finishes(device))


@dataclasses.dataclass
class ColumnsPlan(GemmBackedPlan):
    """Per chunk of images: the gather (fwd, bwd_weight), the GEMM launches, then the scatter (bwd_data)
    or the reduction of the partial weight gradients."""

    kernels: dict[str, cl.Kernel] = dataclasses.field(default_factory=dict)
    layout: Layout | None = None
    sums_images: bool = False   # bwd_weight: the GEMM adds the chunk's images into dW (no split_reduce)

    def _grid(self, pixels: int, rows: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        iwg, ipt = self.config["IWG"], self.config["IPT"]
        return (ceil_div(pixels, iwg * ipt) * iwg, rows, self.layout.chunk), (iwg, 1, 1)

    def enqueue(self, a: cl.Buffer, b: cl.Buffer, out: cl.Buffer, a_offset: int, b_offset: int,
                out_offset: int, bias: cl.Buffer | None, bias_offset: int, beta: float,
                wait_for: list[cl.Event] | None) -> list[cl.Event]:
        p, lay, ws, device, gemm = self.problem, self.layout, self.workspace, self.device, self.gemm_plan
        g = p.groups
        rows, kg, hw, pq = lay.rows, p.k // g, p.h * p.w, p.p * p.q
        events: list[cl.Event] = []

        def waits() -> list[cl.Event] | None:
            # the queue is in order: only the first command needs the caller's events
            return None if events else wait_for

        for n0 in range(0, p.n, lay.chunk):
            if p.direction == "fwd":
                if lay.gathers:   # B = the chunk's columns
                    glob, loc = self._grid(pq, g * rows)
                    events.append(device.launch(self.kernels["gather"], glob, loc, a, a_offset, n0, ws, 0,
                                                wait_for=waits()))
                    x_buf, x_base, x_image, ldx = ws, 0, lay.image, lay.ld
                else:             # B = x itself
                    x_buf, x_base, x_image, ldx = a, a_offset + n0 * p.c * hw, p.c * hw, hw
                for i in range(lay.chunk if lay.over_groups else g):
                    if lay.over_groups:     # image n0+i, batch over groups
                        offsets = {"a_offset": b_offset, "stride_a": kg * rows,
                                   "b_offset": x_base + i * x_image, "stride_b": rows * ldx,
                                   "c_offset": out_offset + (n0 + i) * p.k * pq, "stride_c": kg * pq}
                    else:                   # group i, batch over the chunk's images
                        offsets = {"a_offset": b_offset + i * kg * rows, "stride_a": 0,
                                   "b_offset": x_base + i * rows * ldx, "stride_b": x_image,
                                   "c_offset": out_offset + n0 * p.k * pq + i * kg * pq, "stride_c": p.k * pq}
                    events += gemm.run(b, x_buf, out, beta=beta, ldb=ldx, ldc=pq, wait_for=waits(), **offsets)
            elif p.direction == "bwd_data":
                if lay.gathers:   # C = the workspace, scattered afterwards
                    c_buf, c_base, c_image, ldc, gemm_beta = ws, 0, lay.image, lay.ld, 0.0
                else:             # C = dx itself
                    c_buf, c_base, c_image, ldc = out, out_offset + n0 * p.c * hw, p.c * hw, hw
                    gemm_beta = beta
                for i in range(lay.chunk if lay.over_groups else g):
                    if lay.over_groups:     # image n0+i, batch over groups
                        offsets = {"a_offset": b_offset, "stride_a": kg * rows,
                                   "b_offset": a_offset + (n0 + i) * p.k * pq, "stride_b": kg * pq,
                                   "c_offset": c_base + i * c_image, "stride_c": rows * ldc}
                    else:                   # group i, batch over the chunk's images
                        offsets = {"a_offset": b_offset + i * kg * rows, "stride_a": 0,
                                   "b_offset": a_offset + n0 * p.k * pq + i * kg * pq, "stride_b": p.k * pq,
                                   "c_offset": c_base + i * rows * ldc, "stride_c": c_image}
                    events += gemm.run(b, a, c_buf, beta=gemm_beta, ldb=pq, ldc=ldc, wait_for=waits(),
                                       **offsets)
                if lay.gathers:
                    glob, loc = self._grid(hw, p.c)
                    events.append(device.launch(self.kernels["scatter"], glob, loc, ws, out, out_offset, n0,
                                                beta))
            else:
                pass_beta = beta if n0 == 0 else 1.0   # later chunks accumulate onto the earlier ones
                partials = 0 if self.sums_images else lay.partial_floats
                if lay.gathers:   # the columns sit after the partial sums
                    glob, loc = self._grid(pq, g * rows)
                    events.append(device.launch(self.kernels["gather"], glob, loc, a, a_offset, n0, ws,
                                                partials, wait_for=waits()))
                    x_buf, x_base, x_image, ldx = ws, partials, lay.image, lay.ld
                else:
                    x_buf, x_base, x_image, ldx = a, a_offset + n0 * p.c * hw, p.c * hw, hw
                # one image per pass, or the GEMM adding the images: straight into dw
                direct = lay.chunk == 1 or self.sums_images
                c_buf, c_base, c_image = (out, out_offset, 0) if direct else (ws, 0, p.k * rows)
                for i in range(lay.chunk if lay.over_groups else g):
                    if lay.over_groups:     # image n0+i, batch over groups
                        offsets = {"a_offset": b_offset + (n0 + i) * p.k * pq, "stride_a": kg * pq,
                                   "b_offset": x_base + i * x_image, "stride_b": rows * ldx,
                                   "c_offset": c_base + i * c_image, "stride_c": kg * rows}
                    else:                   # group i, batch over the chunk's images
                        offsets = {"a_offset": b_offset + n0 * p.k * pq + i * kg * pq, "stride_a": p.k * pq,
                                   "b_offset": x_base + i * rows * ldx, "stride_b": x_image,
                                   "c_offset": c_base + i * kg * rows, "stride_c": c_image}
                    events += gemm.run(b, x_buf, c_buf, beta=pass_beta if direct else 0.0, lda=pq, ldb=ldx,
                                       ldc=rows, wait_for=waits(), **offsets)
                if not direct:
                    events.append(self.split_reduce(out, out_offset, lay.chunk, None, 0, pass_beta, None))
        if bias is not None:
            events.append(add_bias(self, out, out_offset, bias, bias_offset, None))
        return events
