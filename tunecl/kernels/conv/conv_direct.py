"""``conv_direct``: tiled direct convolution (``conv_direct.cl``), the general fallback.

Applies to every fp32 :class:`~tunecl.problems.ConvProblem` in all three directions, any stride,
padding, dilation and groups. Strong where the reduction is short (first layers with C=3) or the
spatial size small; the other families beat it on large channel counts.

Parameters (forward and backward-data; "output" means y for fwd and dx for bwd_data):
    TP, TQ: output rows / columns per work-item. KPT: output channels per work-item.
    WGP, WGQ, WGK: work-group shape along output rows, columns and channel blocks.
    LOCAL: 1 stages CCH reduction channels of the input patch and their weights in local memory.
    CCH: reduction channels per local-memory step (1 when LOCAL=0). UNROLL: unroll the filter loops.
Parameters (backward-weight):
    KPT, CPT: output / input channels per work-item, RWG: work-items reducing N*P*Q together,
    SPLIT: work-groups sharing one reduction (partial sums in the workspace, added in a fixed order).
"""

from __future__ import annotations

import numpy as np

from tunecl.kernels.base import Config, Constraint, Space
from tunecl.kernels.conv.conv_common import (FLOAT_BYTES, ConvAlgorithm, KernelPlan, fit_default, is_gpu,
                                             local_mem_limit, max_group_size, staged_space)
from tunecl.kernels.sizes import ceil_div, next_pow2
from tunecl.problems import ConvProblem
from tunecl.runtime import Device

WORKSPACE_CAP = 256 * 2**20   # bytes a split reduction may use
GPU_ACCUMULATORS_PER_GROUP = 16384   # outputs a work-group keeps in registers on a GPU


def _tiled_geometry(problem: ConvProblem) -> tuple[int, int, int, int]:
    """(output rows, output columns, output channels per group, reduction channels per group)."""
    cg, kg = problem.c // problem.groups, problem.k // problem.groups
    if problem.direction == "fwd":
        return problem.p, problem.q, kg, cg
    return problem.h, problem.w, cg, kg


def _patch_floats(problem: ConvProblem, c: Config) -> int:
    """Floats of local memory a LOCAL=1 fwd/bwd_data config stages (mirrors conv_direct.cl)."""
    (sh, sw), (dh, dw) = problem.stride, problem.dilation
    tile_p, tile_q = c["WGP"] * c["TP"], c["WGQ"] * c["TQ"]
    if problem.direction == "fwd":
        rows = (tile_p - 1) * sh + (problem.r - 1) * dh + 1
        cols = (tile_q - 1) * sw + (problem.s - 1) * dw + 1
    else:
        rows = (tile_p - 1 + (problem.r - 1) * dh) // sh + 2
        cols = (tile_q - 1 + (problem.s - 1) * dw) // sw + 2
    return c["CCH"] * rows * cols + c["WGK"] * c["KPT"] * c["CCH"] * problem.r * problem.s


class ConvDirect(ConvAlgorithm):
    """Tiled direct convolution; see the module docstring for the parameters."""

    name = "conv_direct"
    version = 1
    source_file = "conv_direct.cl"

    # -- space -------------------------------------------------------------------------------------
    def space(self, problem: ConvProblem, device: Device) -> Space:
        if problem.direction == "bwd_weight":
            return self._space_bwd_weight(problem, device)
        rows, cols, out_ch, red_ch = _tiled_geometry(problem)
        limit_wg, limit_lm = max_group_size(device), local_mem_limit(device)
        gpu = is_gpu(device)
        params = {
            "TP": (1, 2, 4), "TQ": (1, 2, 4, 8), "KPT": (1, 2, 4, 8),
            "WGP": (1, 2, 4, 8, 16), "WGQ": (4, 8, 16, 32), "WGK": (1, 2, 4),
            "LOCAL": (0, 1), "CCH": (1, 2, 4, 8), "UNROLL": (0, 1),
        }
        constraints = [
            Constraint("work_group_size", lambda c: c["WGP"] * c["WGQ"] * c["WGK"] <= limit_wg),
            Constraint("registers", lambda c: c["KPT"] * c["TP"] * c["TQ"] <= 64),
            # a GPU holds ~64K registers per compute unit: keep a group's accumulators well below
            Constraint("registers_per_group", lambda c: not gpu or c["KPT"] * c["TP"] * c["TQ"]
                       * c["WGP"] * c["WGQ"] * c["WGK"] <= GPU_ACCUMULATORS_PER_GROUP),
            Constraint("cch_only_with_local", lambda c: c["LOCAL"] == 1 or c["CCH"] == 1),
            Constraint("cch_within_reduction", lambda c: c["CCH"] <= next_pow2(red_ch)),
            Constraint("rows_within_output", lambda c: c["WGP"] * c["TP"] <= max(1, next_pow2(rows))),
            Constraint("columns_within_output",
                       lambda c: c["TQ"] == 1 or c["WGQ"] * c["TQ"] <= next_pow2(cols)),
            Constraint("channels_within_group",
                       lambda c: c["KPT"] * c["WGK"] <= max(1, next_pow2(out_ch))),
            Constraint("local_memory",
                       lambda c: c["LOCAL"] == 0 or _patch_floats(problem, c) * FLOAT_BYTES <= limit_lm),
        ]
        return staged_space(params, constraints)

    def _space_bwd_weight(self, problem: ConvProblem, device: Device) -> Space:
        cg, kg = problem.c // problem.groups, problem.k // problem.groups
        npq = problem.n * problem.p * problem.q
        dw_bytes = problem.k * cg * problem.r * problem.s * FLOAT_BYTES
        limit_wg, limit_lm = max_group_size(device), local_mem_limit(device)
        params = {"KPT": (1, 2, 4, 8), "CPT": (1, 2, 4, 8), "RWG": (16, 32, 64, 128, 256),
                  "SPLIT": (1, 2, 4, 8, 16, 32, 64)}
        constraints = [
            Constraint("work_group_size", lambda c: c["RWG"] <= limit_wg),
            Constraint("registers", lambda c: c["KPT"] * c["CPT"] <= 32),
            Constraint("channels_within_group",
                       lambda c: c["KPT"] <= next_pow2(kg) and c["CPT"] <= next_pow2(cg)),
            Constraint("local_memory", lambda c: c["KPT"] * c["CPT"] * c["RWG"] * FLOAT_BYTES <= limit_lm),
            Constraint("split_has_work", lambda c: c["SPLIT"] == 1 or c["SPLIT"] * c["RWG"] <= npq),
            Constraint("workspace", lambda c: c["SPLIT"] == 1 or c["SPLIT"] * dw_bytes <= WORKSPACE_CAP),
        ]
        return staged_space(params, constraints)

    # -- default -----------------------------------------------------------------------------------
    def default(self, problem: ConvProblem, device: Device) -> Config:
        space = self.space(problem, device)
        gpu = is_gpu(device)
        if problem.direction == "bwd_weight":
            cg, kg = problem.c // problem.groups, problem.k // problem.groups
            npq = problem.n * problem.p * problem.q
            blocks = (ceil_div(kg, 4) * ceil_div(cg, 4) * problem.groups * problem.r * problem.s)
            rwg = 256 if gpu else 64
            # enough work-groups to fill the device: split the reduction when the weights are few
            want = (4 * device.fingerprint.compute_units) if gpu else 2 * device.fingerprint.compute_units
            split = 1
            while blocks * split < want and split < 64 and (split * 2) * rwg <= npq:
                split *= 2
            return fit_default(space, {"KPT": 4, "CPT": 4, "RWG": rwg, "SPLIT": split})
        _rows, cols, out_ch, red_ch = _tiled_geometry(problem)
        if gpu:
            preferred = {"TP": 2, "TQ": 1, "KPT": 8 if out_ch >= 32 else 4, "WGP": 8,
                         "WGQ": 32 if cols >= 32 else 16, "WGK": 1, "LOCAL": 1,
                         "CCH": 4 if red_ch >= 4 else 1, "UNROLL": 1}
        else:
            preferred = {"TP": 1, "TQ": 2, "KPT": 4, "WGP": 2, "WGQ": 8, "WGK": 1, "LOCAL": 0,
                         "CCH": 1, "UNROLL": 0}
        return fit_default(space, preferred)

    # -- build -------------------------------------------------------------------------------------
    def build(self, problem: ConvProblem, device: Device, config: Config) -> KernelPlan:
        self.check(problem, device, config)
        program = self.program(device, problem, config)
        p = problem
        cg, kg = p.c // p.groups, p.k // p.groups
        i32, f32 = np.int32, np.float32
        if p.direction == "fwd":
            kernel = device.kernel(program, "conv_direct_fwd",
                                   [None, i32, None, i32, None, i32, None, i32, i32, f32])
        elif p.direction == "bwd_data":
            kernel = device.kernel(program, "conv_direct_bwd_data", [None, i32, None, i32, None, i32, f32])
        else:
            kernel = device.kernel(program, "conv_direct_bwd_weight",
                                   [None, i32, None, i32, None, i32, None, f32])
        if p.direction == "bwd_weight":
            blocks = p.groups * ceil_div(kg, config["KPT"]) * ceil_div(cg, config["CPT"]) * p.r * p.s
            global_size = (blocks * config["RWG"], config["SPLIT"])
            local_size = (config["RWG"], 1)
            workspace = (config["SPLIT"] * p.k * cg * p.r * p.s * FLOAT_BYTES
                         if config["SPLIT"] > 1 else 0)
        else:
            rows, cols, out_ch, _ = _tiled_geometry(p)
            tile_p, tile_q = config["WGP"] * config["TP"], config["WGQ"] * config["TQ"]
            channel_blocks = ceil_div(out_ch, config["WGK"] * config["KPT"])
            global_size = (ceil_div(cols, tile_q) * config["WGQ"], ceil_div(rows, tile_p) * config["WGP"],
                           p.n * p.groups * channel_blocks * config["WGK"])
            local_size = (config["WGQ"], config["WGP"], config["WGK"])
            workspace = 0
        return KernelPlan(self.name, dict(config), problem, device, workspace, kernel=kernel,
                          global_size=global_size, local_size=local_size)


ALGORITHMS = [ConvDirect()]
