"""``conv_depthwise``: depthwise convolution (``conv_depthwise.cl``).

Applies when groups == C (each group one input channel) with K = M·C output channels (channel
multiplier M ≥ 1): any stride, padding, dilation and filter size; fwd, bwd_data and bwd_weight.

Parameters (fwd, bwd_data): TP, TQ output rows / columns per work-item; WGP, WGQ the work-group
shape; LOCAL=1 stages the input patch of the work-group's tile in local memory.
Parameters (bwd_weight): TPT filter taps per work-item, RWG work-items reducing N*P*Q together,
SPLIT work-groups sharing one reduction (partial sums in the workspace, added in a fixed order).
"""

from __future__ import annotations

import numpy as np

from tunecl.kernels import split_finish
from tunecl.kernels.base import Config, Constraint, Space
from tunecl.kernels.conv.conv_common import (FLOAT_BYTES, ConvAlgorithm, KernelPlan, fit_default, is_gpu,
                                             local_mem_limit, max_group_size, staged_space, supported)
from tunecl.kernels.sizes import ceil_div, next_pow2
from tunecl.problems import ConvProblem
from tunecl.runtime import Device

WORKSPACE_CAP = 256 * 2**20   # bytes a split reduction may use
# bwd_weight with SPLIT > 1: the last work-group of each channel's tap block adds the SPLIT partial sums
# itself, in the fixed order (``split_finish.cl``: one launch). False: a ``split_reduce`` launch does.
FINISH_SPLITS = True


def _patch_floats(problem: ConvProblem, c: Config) -> int:
    """Floats of local memory a LOCAL=1 config stages (mirrors conv_depthwise.cl)."""
    (sh, sw), (dh, dw) = problem.stride, problem.dilation
    tile_p, tile_q = c["WGP"] * c["TP"], c["WGQ"] * c["TQ"]
    if problem.direction == "fwd":
        return (((tile_p - 1) * sh + (problem.r - 1) * dh + 1)
                * ((tile_q - 1) * sw + (problem.s - 1) * dw + 1))
    return ((tile_p - 1 + (problem.r - 1) * dh) // sh + 2) * ((tile_q - 1 + (problem.s - 1) * dw) // sw + 2)


class ConvDepthwise(ConvAlgorithm):
    """Depthwise convolution with channel multiplier; see the module docstring for the parameters."""

    name = "conv_depthwise"
    version = 1
    source_file = "conv_depthwise.cl"

    def applies(self, problem: ConvProblem, device: Device) -> bool:
        return (problem.kind == "conv" and supported(problem) and problem.groups == problem.c
                and problem.k % problem.c == 0)

    def space(self, problem: ConvProblem, device: Device) -> Space:
        limit_wg, limit_lm = max_group_size(device), local_mem_limit(device)
        if problem.direction == "bwd_weight":
            npq = problem.n * problem.p * problem.q
            taps = problem.r * problem.s
            dw_bytes = problem.k * taps * FLOAT_BYTES
            params = {"TPT": (1, 2, 3, 4, 5, 7, 9, 16, 25), "RWG": (16, 32, 64, 128, 256),
                      "SPLIT": (1, 2, 4, 8, 16, 32, 64)}
            constraints = [
                Constraint("work_group_size", lambda c: c["RWG"] <= limit_wg),
                Constraint("taps_within_filter", lambda c: c["TPT"] <= taps),
                Constraint("local_memory", lambda c: c["TPT"] * c["RWG"] * FLOAT_BYTES <= limit_lm),
                Constraint("split_has_work", lambda c: c["SPLIT"] == 1 or c["SPLIT"] * c["RWG"] <= npq),
                Constraint("workspace", lambda c: c["SPLIT"] == 1 or c["SPLIT"] * dw_bytes <= WORKSPACE_CAP),
            ]
            return staged_space(params, constraints)
        rows, cols = (problem.p, problem.q) if problem.direction == "fwd" else (problem.h, problem.w)
        params = {"TP": (1, 2, 4), "TQ": (1, 2, 4, 8), "WGP": (1, 2, 4, 8, 16), "WGQ": (4, 8, 16, 32),
                  "LOCAL": (0, 1)}
        constraints = [
            Constraint("work_group_size", lambda c: c["WGP"] * c["WGQ"] <= limit_wg),
            Constraint("rows_within_output", lambda c: c["WGP"] * c["TP"] <= max(1, next_pow2(rows))),
            Constraint("columns_within_output",
                       lambda c: c["TQ"] == 1 or c["WGQ"] * c["TQ"] <= next_pow2(cols)),
            Constraint("local_memory",
                       lambda c: c["LOCAL"] == 0 or _patch_floats(problem, c) * FLOAT_BYTES <= limit_lm),
        ]
        return staged_space(params, constraints)

    def default(self, problem: ConvProblem, device: Device) -> Config:
        space = self.space(problem, device)
        gpu = is_gpu(device)
        if problem.direction == "bwd_weight":
            npq = problem.n * problem.p * problem.q
            taps = problem.r * problem.s
            tpt = min(taps, 9)
            rwg = 256 if gpu else 64
            want = (4 if gpu else 2) * device.fingerprint.compute_units
            blocks = problem.k * ceil_div(taps, tpt)
            split = 1
            while blocks * split < want and split < 64 and (split * 2) * rwg <= npq:
                split *= 2
            return fit_default(space, {"TPT": tpt, "RWG": rwg, "SPLIT": split})
        cols = problem.q if problem.direction == "fwd" else problem.w
        if gpu:
            preferred = {"TP": 2, "TQ": 1, "WGP": 8, "WGQ": 32 if cols > 16 else 16 if cols > 8 else 8,
                         "LOCAL": 1}
        else:
            preferred = {"TP": 1, "TQ": 2, "WGP": 4, "WGQ": 8, "LOCAL": 0}
        return fit_default(space, preferred)

    def build(self, problem: ConvProblem, device: Device, config: Config) -> KernelPlan:
        self.check(problem, device, config)
        finish = (problem.direction == "bwd_weight" and config["SPLIT"] > 1 and FINISH_SPLITS
                  and split_finish.finishes(device))
        program = self.program(device, problem, config, ["-DSPLIT_FINISH=1"] if finish else [])
        p = problem
        i32, f32 = np.int32, np.float32
        workspace = 0
        if p.direction == "bwd_weight":
            kernel = device.kernel(program, "conv_depthwise_bwd_weight",
                                   [None, i32, None, i32, None, i32, None, f32])
            global_size = (p.k * ceil_div(p.r * p.s, config["TPT"]) * config["RWG"], config["SPLIT"])
            local_size = (config["RWG"], 1)
            if config["SPLIT"] > 1:
                workspace = config["SPLIT"] * p.k * p.r * p.s * FLOAT_BYTES
            parts = workspace
            if finish:   # a counter per channel's tap block (work-group of dimension 0)
                workspace += global_size[0] // config["RWG"] * 4
        else:
            fwd = p.direction == "fwd"
            rows, cols, planes = (p.p, p.q, p.n * p.k) if fwd else (p.h, p.w, p.n * p.c)
            if fwd:
                kernel = device.kernel(program, "conv_depthwise_fwd",
                                       [None, i32, None, i32, None, i32, None, i32, i32, f32])
            else:
                kernel = device.kernel(program, "conv_depthwise_bwd_data",
                                       [None, i32, None, i32, None, i32, f32])
            global_size = (ceil_div(cols, config["WGQ"] * config["TQ"]) * config["WGQ"],
                           ceil_div(rows, config["WGP"] * config["TP"]) * config["WGP"], planes)
            local_size = (config["WGQ"], config["WGP"], 1)
        plan = KernelPlan(self.name, dict(config), problem, device, workspace, kernel=kernel,
                          global_size=global_size, local_size=local_size, finish=finish)
        if finish:
            plan.clear_counters(parts)
        return plan


ALGORITHMS = [ConvDepthwise()]
