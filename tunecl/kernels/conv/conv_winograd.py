"""``conv_winograd`` (F(2×2,3×3)) and ``conv_winograd_f4`` (F(4×4,3×3)): Winograd convolution for
3×3 filters with stride 1 and dilation 1 (any padding, groups), forward and backward-data.

The transforms live in ``conv_winograd.cl``; the (M+2)²·G element-wise products are one batched
GEMM of the GEMM family's ``gemm_tiled`` over the plan's workspace:

    U = G·f·Gᵀ (filters)   V = Bᵀ·d·B (input tiles)   Z[ξ] = U[ξ]·V[ξ]   out = Aᵀ·Z·A

Backward-data is the forward convolution of dy with the transposed, 180°-rotated filters and padding
2 − pad. Images go in chunks whose V and Z fit ``WORKSPACE_CAP``. ``run`` (the plan contract)
transforms the filters into the workspace on every call; a caller that knows when a weight changes
splits it in two: :meth:`WinogradPlan.transform_weight` writes U (``u_floats`` floats) into a buffer
of its own, once per weight version, and :meth:`WinogradPlan.run_transformed` runs the rest from it
(the PyTorch backend does, see :mod:`tunecl.backend.weight_cache`). U depends on the weight and on
:attr:`WinogradPlan.transform_key` only (not on the batch or the config). The forward bias is fused
into the output transform. F(4×4,3×3) does 2.25× fewer multiplications per output than F(2×2,3×3) but its
transforms have larger coefficients, so its rounding errors are larger.

Parameters: IWG (work-items per work-group of the transforms) and ``gemm_tiled``'s own parameters
prefixed ``g_``.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pyopencl as cl

from tunecl.kernels.base import Config, Constraint
from tunecl.kernels.conv.conv_common import (FLOAT_BYTES, GemmBackedAlgorithm, GemmBackedPlan, OwnSpace,
                                             image_chunk, is_gpu, max_group_size, split_gemm_config,
                                             supported)
from tunecl.kernels.sizes import ceil_div, round_up
from tunecl.problems import ConvProblem, GemmProblem
from tunecl.runtime import Device

WORKSPACE_CAP = 256 * 2**20   # bytes of transformed tiles (V and Z) a plan may hold

# m -> (G, Bᵀ, Aᵀ) of F(m×m,3×3), the matrices of conv_winograd.cl (for references and error bounds)
MATRICES = {
    2: ([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]],
        [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
        [[1, 1, 1, 0], [0, 1, -1, -1]]),
    4: ([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
         [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]],
        [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
         [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]),
}


@dataclasses.dataclass(frozen=True)
class Layout:
    """The forward convolution a problem becomes, its chunking and its GEMM (sizes in elements)."""

    m: int                  # outputs per tile side
    ci: int                 # "in" channels (C for fwd, K for bwd_data)
    co: int                 # "out" channels
    hi: int
    wi: int
    ho: int
    wo: int
    pad: tuple[int, int]    # padding of the "in" tensor (negative: crop)
    chunk: int              # images per pass
    tiles: int              # tiles per chunk
    t_ld: int               # row stride of V and Z (tiles padded to 4)
    u_floats: int
    v_floats: int
    z_floats: int
    gemm: GemmProblem

    @property
    def workspace_floats(self) -> int:
        return self.u_floats + self.v_floats + self.z_floats

    def defines(self, flip: bool) -> list[str]:
        values = {"CI": self.ci, "CO": self.co, "HI": self.hi, "WI": self.wi, "HO": self.ho, "WO": self.wo,
                  "PH_IN": self.pad[0], "PW_IN": self.pad[1], "FLIP": int(flip), "CHUNK_N": self.chunk,
                  "T_LD": self.t_ld, "WINO_M": self.m}
        return [f"-D{name}={value}" for name, value in values.items()]


@functools.lru_cache(maxsize=256)
def layout(problem: ConvProblem, m: int) -> Layout | None:
    """The Winograd F(m×m,3×3) layout of ``problem``; None when one image does not fit the cap."""
    p = problem
    if p.direction == "fwd":
        ci, co, hi, wi, ho, wo, pad = p.c, p.k, p.h, p.w, p.p, p.q, p.padding
    else:
        ci, co, hi, wi, ho, wo = p.k, p.c, p.p, p.q, p.h, p.w
        pad = (2 - p.padding[0], 2 - p.padding[1])
    alpha2 = (m + 2) ** 2
    tiles_per_image = ceil_div(ho, m) * ceil_div(wo, m)

    def floats(d: int) -> int:
        return alpha2 * (ci + co) * round_up(d * tiles_per_image, 4)

    chunk = image_chunk(p.n, lambda d: floats(d) * FLOAT_BYTES <= WORKSPACE_CAP)
    if not chunk:
        return None
    tiles = chunk * tiles_per_image
    t_ld = round_up(tiles, 4)
    g = p.groups
    gemm = GemmProblem(co // g, tiles, ci // g, batch=alpha2 * g)
    return Layout(m, ci, co, hi, wi, ho, wo, pad, chunk, tiles, t_ld, alpha2 * co * (ci // g),
                  alpha2 * ci * t_ld, alpha2 * co * t_ld, gemm)


class ConvWinograd(GemmBackedAlgorithm):
    """Winograd F(m×m,3×3) with the products on ``gemm_tiled``; see the module docstring."""

    version = 1
    source_file = "conv_winograd.cl"

    def __init__(self, m: int, name: str):
        self.m = m
        self.name = name

    def layout(self, problem: ConvProblem) -> Layout | None:
        return layout(problem, self.m)

    def applies(self, problem: ConvProblem, device: Device) -> bool:
        return (problem.kind == "conv" and supported(problem) and problem.direction != "bwd_weight"
                and (problem.r, problem.s) == (3, 3) and problem.stride == (1, 1)
                and problem.dilation == (1, 1) and self.gemm_applies(problem, device)
                and self.workspace_fits(problem, device))

    def own_space(self, problem: ConvProblem, device: Device) -> OwnSpace:
        limit_wg = max_group_size(device)
        return {"IWG": (64, 128, 256)}, [Constraint("work_group_size", lambda c: c["IWG"] <= limit_wg)]

    def own_default(self, problem: ConvProblem, device: Device) -> Config:
        return {"IWG": 128 if is_gpu(device) and max_group_size(device) >= 128 else 64}

    def build(self, problem: ConvProblem, device: Device, config: Config) -> WinogradPlan:
        self.check(problem, device, config)
        own, _ = split_gemm_config(config)
        lay = layout(problem, self.m)
        program = self.program(device, problem, own, lay.defines(problem.direction == "bwd_data"))
        i32, f32 = np.int32, np.float32
        kernels = {
            "filter": device.kernel(program, "winograd_filter", [None, i32, None, i32]),
            "input": device.kernel(program, "winograd_input", [None, i32, i32, None, i32]),
            "output": device.kernel(program, "winograd_output",
                                    [None, i32, i32, None, i32, None, i32, i32, f32]),
        }
        return WinogradPlan(self.name, dict(config), problem, device, lay.workspace_floats * FLOAT_BYTES,
                            kernels=kernels, gemm_plan=self.build_gemm(problem, device, config), layout=lay)


@dataclasses.dataclass
class WinogradPlan(GemmBackedPlan):
    """Filter transform, then per chunk: input transform, the batched GEMM, output transform.

    ``run`` = :meth:`transform_weight` into the workspace + :meth:`run_transformed` from there.
    """

    kernels: dict[str, cl.Kernel] = dataclasses.field(default_factory=dict)
    layout: Layout | None = None

    @property
    def u_floats(self) -> int:
        """Floats of the transformed filters U (what :meth:`transform_weight` writes)."""
        return self.layout.u_floats

    @functools.cached_property
    def transform_key(self) -> tuple:
        """What U depends on besides the weight: plans with equal keys (any batch, any config) can share
        one transformed weight. (F(m×m), flipped for bwd_data, in and out channels, groups.)"""
        lay = self.layout
        return ("winograd", lay.m, self.problem.direction == "bwd_data", lay.ci, lay.co, self.problem.groups)

    def transform_weight(self, w: cl.Buffer, u: cl.Buffer, *, w_offset: int = 0, u_offset: int = 0,
                         wait_for: list[cl.Event] | None = None) -> list[cl.Event]:
        """Enqueue U = G·f·Gᵀ of the weight ``w`` (the plan contract's ``b``) into ``u`` at ``u_offset``
        (``u_floats`` floats)."""
        iwg, lay = self.config["IWG"], self.layout
        cig = lay.ci // self.problem.groups
        return [self.device.launch(self.kernels["filter"], (round_up(lay.co * cig, iwg),), (iwg,), w,
                                   int(w_offset), u, int(u_offset), wait_for=wait_for)]

    def run_transformed(self, a: cl.Buffer, u: cl.Buffer, out: cl.Buffer, *, a_offset: int = 0, u_offset: int = 0,
                        out_offset: int = 0, bias: cl.Buffer | None = None, bias_offset: int = 0,
                        beta: float = 0.0, wait_for: list[cl.Event] | None = None) -> list[cl.Event]:
        """``run`` with the filters already transformed into ``u`` at ``u_offset`` by :meth:`transform_weight`
        (the other arguments as in the plan contract)."""
        if bias is not None and self.problem.direction != "fwd":
            raise ValueError(f"bias is only defined for the forward direction, not {self.problem.direction}")
        return self._rest(a, u, int(u_offset), out, int(a_offset), int(out_offset), bias, int(bias_offset),
                          float(beta), list(wait_for) if wait_for else None)

    def enqueue(self, a: cl.Buffer, b: cl.Buffer, out: cl.Buffer, a_offset: int, b_offset: int,
                out_offset: int, bias: cl.Buffer | None, bias_offset: int, beta: float,
                wait_for: list[cl.Event] | None) -> list[cl.Event]:
        events = self.transform_weight(b, self.workspace, w_offset=b_offset, wait_for=wait_for)
        return events + self._rest(a, self.workspace, 0, out, a_offset, out_offset, bias, bias_offset, beta, None)

    def _rest(self, a: cl.Buffer, u: cl.Buffer, u_offset: int, out: cl.Buffer, a_offset: int, out_offset: int,
              bias: cl.Buffer | None, bias_offset: int, beta: float,
              wait_for: list[cl.Event] | None) -> list[cl.Event]:
        """Per chunk of images: input transform, the batched GEMM with U, output transform (in order)."""
        lay, ws, device = self.layout, self.workspace, self.device
        iwg = self.config["IWG"]
        g = self.problem.groups
        cig, cog = lay.ci // g, lay.co // g
        v_offset, z_offset = lay.u_floats, lay.u_floats + lay.v_floats
        bias_buf, bias_off, use_bias = self.bias_args(bias, bias_offset)
        tiles_grid = round_up(lay.tiles, iwg)
        events = []
        for n0 in range(0, self.problem.n, lay.chunk):
            events.append(device.launch(self.kernels["input"], (tiles_grid, lay.ci), (iwg, 1), a, a_offset,
                                        n0, ws, v_offset, wait_for=wait_for if n0 == 0 else None))
            events += self.gemm_plan.run(u, ws, ws, a_offset=u_offset, stride_a=cog * cig, b_offset=v_offset,
                                         ldb=lay.t_ld, stride_b=cig * lay.t_ld, c_offset=z_offset,
                                         ldc=lay.t_ld, stride_c=cog * lay.t_ld)
            events.append(device.launch(self.kernels["output"], (tiles_grid, lay.co), (iwg, 1), ws, z_offset,
                                        n0, out, out_offset, bias_buf, bias_off, use_bias, beta))
        return events


ALGORITHMS = [ConvWinograd(2, "conv_winograd"), ConvWinograd(4, "conv_winograd_f4")]
