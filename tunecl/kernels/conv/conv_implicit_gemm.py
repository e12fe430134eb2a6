"""``conv_implicit_gemm``: convolution as a tiled GEMM with im2col fused into the tile loads
(``conv_implicit_gemm.cl``): no workspace unless the reduction is split.

Applies to every fp32 problem, all three directions, any stride, padding, dilation and groups. Per
group, ``C[GM×GN] = A[GM×GK]·B[GK×GN]`` with (GM, GN, GK) = (K/G, N·P·Q, C/G·R·S) for fwd,
(C/G, N·H·W, K/G·R·S) for bwd_data and (K/G, C/G·R·S, N·P·Q) for bwd_weight (a GEMM over the
N·P·Q reduction, split over work-groups and summed in a fixed order instead of with atomics).

Parameters: MWG, NWG, KWG (tile of C and reduction step), MDIMC, NDIMC (work-items per tile
along GM and GN), VWM, VWN (vector width of local-memory reads), SPLIT (work-groups sharing one
reduction: partial sums go to the workspace, and the last work-group of each output tile adds them,
:data:`FINISH_SPLITS`), LPAD (pad local rows by
one vector against bank conflicts), PREFETCH (load the next reduction step into registers while
multiplying this one).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyopencl as cl

from tunecl.kernels import split_finish
from tunecl.kernels.base import Config, Constraint, Space
from tunecl.kernels.conv.conv_common import (FLOAT_BYTES, ConvAlgorithm, ConvPlan, fit_default, is_gpu,
                                             local_mem_limit, max_group_size, out_elements, staged_space)
from tunecl.kernels.sizes import ceil_div, next_pow2
from tunecl.problems import ConvProblem
from tunecl.runtime import Device

WORKSPACE_CAP = 256 * 2**20   # bytes the split partial sums may use
# SPLIT > 1: the last work-group of each output tile adds the SPLIT partial sums itself, in the fixed order
# (``split_finish.cl``: one launch). False: a separate ``split_reduce`` launch adds them (the same sums).
FINISH_SPLITS = True
MAX_OUTPUTS_PER_ITEM = 128    # accumulators per work-item (registers on a GPU)


def gemm_shape(problem: ConvProblem) -> tuple[int, int, int]:
    """(GM, GN, GK) of the per-group GEMM the direction computes."""
    p = problem
    cg, kg = p.c // p.groups, p.k // p.groups
    if p.direction == "fwd":
        return kg, p.n * p.p * p.q, cg * p.r * p.s
    if p.direction == "bwd_data":
        return cg, p.n * p.h * p.w, kg * p.r * p.s
    return kg, cg * p.r * p.s, p.n * p.p * p.q


def local_floats(c: Config) -> int:
    """Floats of local memory a config declares (mirrors a_alm and b_alm in the .cl)."""
    return c["KWG"] * (c["MWG"] + c["NWG"] + c["LPAD"] * (c["VWM"] + c["VWN"]))


def k_chunk(gk: int, split: int, kwg: int) -> int:
    """Reduction length per split, in whole KWG steps (mirrors KCHUNK in the .cl)."""
    return ceil_div(ceil_div(gk, split), kwg) * kwg


class ConvImplicitGemm(ConvAlgorithm):
    """Implicit-GEMM convolution; see the module docstring for the parameters."""

    name = "conv_implicit_gemm"
    version = 1
    source_file = "conv_implicit_gemm.cl"

    def space(self, problem: ConvProblem, device: Device) -> Space:
        gm, gn, gk = gemm_shape(problem)
        limit_wg, limit_lm = max_group_size(device), local_mem_limit(device)
        out_bytes = out_elements(problem) * FLOAT_BYTES
        params = {"MWG": (16, 32, 64, 128), "NWG": (16, 32, 64, 128), "KWG": (8, 16, 32),
                  "MDIMC": (4, 8, 16, 32), "NDIMC": (4, 8, 16, 32), "VWM": (1, 2, 4), "VWN": (1, 2, 4),
                  "SPLIT": (1, 2, 4, 8, 16, 32, 64, 128), "LPAD": (0, 1),
                  "PREFETCH": (0, 1)}
        constraints = [
            Constraint("work_group_size", lambda c: 16 <= c["MDIMC"] * c["NDIMC"] <= limit_wg),
            Constraint("m_tile_divides", lambda c: c["MWG"] % (c["MDIMC"] * c["VWM"]) == 0),
            Constraint("n_tile_divides", lambda c: c["NWG"] % (c["NDIMC"] * c["VWN"]) == 0),
            Constraint("threads_fit_tiles",
                       lambda c: c["MDIMC"] * c["NDIMC"] <= c["KWG"] * min(c["MWG"], c["NWG"])),
            Constraint("registers",
                       lambda c: (c["MWG"] // c["MDIMC"]) * (c["NWG"] // c["NDIMC"]) <= MAX_OUTPUTS_PER_ITEM),
            Constraint("local_memory", lambda c: local_floats(c) * FLOAT_BYTES <= limit_lm),
            Constraint("m_tile_within_problem", lambda c: c["MWG"] <= max(16, next_pow2(gm))),
            Constraint("n_tile_within_problem", lambda c: c["NWG"] <= max(16, next_pow2(gn))),
            Constraint("k_step_within_problem", lambda c: c["KWG"] <= max(8, next_pow2(gk))),
            Constraint("split_has_work",
                       lambda c: c["SPLIT"] == 1 or (c["SPLIT"] - 1) * k_chunk(gk, c["SPLIT"], c["KWG"]) < gk),
            Constraint("workspace", lambda c: c["SPLIT"] == 1 or c["SPLIT"] * out_bytes <= WORKSPACE_CAP),
        ]

        return staged_space(params, constraints)

    def default(self, problem: ConvProblem, device: Device) -> Config:
        space = self.space(problem, device)
        gm, gn, gk = gemm_shape(problem)
        units = device.fingerprint.compute_units
        if is_gpu(device):
            big = gm >= 128 and gn >= 128 and ceil_div(gm, 128) * ceil_div(gn, 128) * problem.groups >= units
            if big:
                preferred = {"MWG": 128, "NWG": 128, "KWG": 16, "MDIMC": 16, "NDIMC": 16, "VWM": 4, "VWN": 4,
                             "LPAD": 1, "PREFETCH": 1}
            else:
                preferred = {"MWG": 64, "NWG": 64, "KWG": 16, "MDIMC": 16, "NDIMC": 16, "VWM": 4, "VWN": 4,
                             "LPAD": 1, "PREFETCH": 1}
            want = 2 * units
        else:
            preferred = {"MWG": 32, "NWG": 32, "KWG": 16, "MDIMC": 8, "NDIMC": 8, "VWM": 4, "VWN": 4,
                         "LPAD": 0, "PREFETCH": 0}
            want = 2 * units
        preferred["MWG"] = min(preferred["MWG"], max(16, next_pow2(gm)))
        preferred["NWG"] = min(preferred["NWG"], max(16, next_pow2(gn)))
        preferred["MDIMC"] = min(preferred["MDIMC"], preferred["MWG"] // preferred["VWM"])
        preferred["NDIMC"] = min(preferred["NDIMC"], preferred["NWG"] // preferred["VWN"])
        # split the reduction when the output tiles alone cannot fill the device
        tiles = ceil_div(gm, preferred["MWG"]) * ceil_div(gn, preferred["NWG"]) * problem.groups
        split = 1
        while tiles * split < want and split < 128 and gk >= 2 * split * 8 * preferred["KWG"]:
            split *= 2
        preferred["SPLIT"] = split
        return fit_default(space, preferred)

    def build(self, problem: ConvProblem, device: Device, config: Config) -> ImplicitGemmPlan:
        self.check(problem, device, config)
        finish = config["SPLIT"] > 1 and FINISH_SPLITS and split_finish.finishes(device)
        program = self.program(device, problem, config, ["-DSPLIT_FINISH=1"] if finish else [])
        i32, f32 = np.int32, np.float32
        kernel = device.kernel(program, "conv_implicit_gemm",
                               [None, i32, None, i32, None, i32, None, None, i32, i32, f32])
        return ImplicitGemmPlan.launching(self.name, problem, device, config, kernel,
                                          config["MDIMC"] * config["NDIMC"], finish=finish)


@dataclasses.dataclass
class ImplicitGemmPlan(ConvPlan):
    """One GEMM-shaped launch, plus a fixed-order reduction of the partial sums when SPLIT > 1: by the
    kernel's last work-group of each tile (``finish``), else by a second launch."""

    kernel: cl.Kernel | None = None
    global_size: tuple[int, ...] = ()
    local_size: tuple[int, ...] = ()
    finish: bool = False

    @classmethod
    def launching(cls, name: str, problem: ConvProblem, device: Device, config: Config, kernel: cl.Kernel,
                  threads: int, finish: bool = False) -> ImplicitGemmPlan:
        """A plan of ``kernel`` with ``threads`` work-items per MWG x NWG tile of the GEMM view, one
        grid layer per group and SPLIT part, and a workspace for the partial sums when SPLIT > 1; with
        ``finish`` (a kernel built with SPLIT_FINISH) the workspace also holds a counter per tile, zero."""
        gm, gn, _ = gemm_shape(problem)
        split = config["SPLIT"]
        tiles = (ceil_div(gn, config["NWG"]), ceil_div(gm, config["MWG"]), problem.groups)
        global_size = (tiles[0] * threads, tiles[1], problem.groups * split)
        parts = split * out_elements(problem) * FLOAT_BYTES if split > 1 else 0
        counters = tiles[0] * tiles[1] * tiles[2] * 4 if finish and split > 1 else 0
        plan = cls(name, dict(config), problem, device, parts + counters, kernel=kernel, global_size=global_size,
                   local_size=(threads, 1, 1), finish=bool(counters))
        if counters:
            plan.clear_counters(parts)
        return plan

    def enqueue(self, a: cl.Buffer, b: cl.Buffer, out: cl.Buffer, a_offset: int, b_offset: int,
                out_offset: int, bias: cl.Buffer | None, bias_offset: int, beta: float,
                wait_for: list[cl.Event] | None) -> list[cl.Event]:
        split = self.config["SPLIT"]
        ws = self.workspace if split > 1 else self._dummy
        # the GEMM's A operand is the contract's b (weights, or dy for bwd_weight) and B is a
        first = self.device.launch(self.kernel, self.global_size, self.local_size, b, b_offset, a,
                                   a_offset, out, out_offset, ws, *self.bias_args(bias, bias_offset),
                                   beta, wait_for=wait_for)
        if split == 1 or self.finish:
            return [first]
        return [first, self.split_reduce(out, out_offset, split, bias, bias_offset, beta, [first])]


ALGORITHMS = [ConvImplicitGemm()]
