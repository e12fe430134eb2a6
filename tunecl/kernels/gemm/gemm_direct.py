"""gemm_direct: a GEMM without local-memory tiles, for small and skinny problems.

Same semantics and the same :class:`~tunecl.kernels.gemm.core.GemmPlan` (``run`` signature) as
``gemm_tiled``; the OpenCL C is ``gemm_direct.cl``. Tunables, with the values searched:

=====  ===================  ===========================================================================
MDIMD  1 2 4 8 16 32        threads per work-group along M
NDIMD  1 2 4 8 16 32        threads per work-group along N
KSL    1 2 4 8 16 32        threads per work-group along K (split K, summed through local memory)
MWID   1 2 4 8              outputs per thread along M (strided by MDIMD)
NWID   1 2 4 8              outputs per thread along N (strided by NDIMD)
VWK    1 2 4                floats per K step; vector loads where K is contiguous
KWID   1 2 4                K steps per unrolled loop iteration
=====  ===================  ===========================================================================

Alignment: VWK-wide loads of a K-contiguous operand need its offset, leading dimension and batch
stride to be multiples of VWK; otherwise the plan runs a variant compiled with scalar loads for it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from tunecl.kernels.base import Config, Space, build_options, read_source
from tunecl.kernels.gemm.core import (Fp32Gemm, GemmPlan, Rule, Variant, check_config, check_dtype,
                                      device_type, layout_options, make_space, widest)
from tunecl.kernels.sizes import next_pow2
from tunecl.problems import GemmProblem
from tunecl.runtime import Device

NAME = "gemm_direct"
VERSION = 1

_PARAMS: dict[str, tuple[int, ...]] = {
    "MDIMD": (1, 2, 4, 8, 16, 32), "NDIMD": (1, 2, 4, 8, 16, 32), "KSL": (1, 2, 4, 8, 16, 32),
    "MWID": (1, 2, 4, 8), "NWID": (1, 2, 4, 8), "VWK": (1, 2, 4), "KWID": (1, 2, 4),
}


def _threads(c: Mapping[str, int]) -> int:
    return c["KSL"] * c["NDIMD"] * c["MDIMD"]


def _constraints(problem: GemmProblem, device: Any) -> list[Rule]:
    return [
        ("work_group_size_within_device", ("MDIMD", "NDIMD", "KSL"),
         lambda c: _threads(c) <= device.max_work_group_size),
        ("local_memory_within_device", ("MDIMD", "NDIMD", "KSL", "MWID", "NWID"),
         lambda c: c["KSL"] == 1 or 4 * _threads(c) * c["MWID"] * c["NWID"] <= device.local_mem_size),
    ]


def _pruning(problem: GemmProblem, device: Any) -> list[Rule]:
    """Rules that drop valid configs which cannot pay off for this problem (search-space size only)."""
    m_cap, n_cap, k_cap = next_pow2(problem.m), next_pow2(problem.n), next_pow2(problem.k)
    # At least 16 threads per work-group unless the whole problem has fewer useful threads.
    min_threads = min(16, m_cap * n_cap * min(32, k_cap))
    return [
        ("block_within_problem", ("MDIMD", "NDIMD", "MWID", "NWID"),
         lambda c: c["MDIMD"] * c["MWID"] <= m_cap and c["NDIMD"] * c["NWID"] <= n_cap),
        ("k_split_within_problem", ("KSL", "VWK", "KWID"),
         lambda c: c["KSL"] * c["VWK"] * c["KWID"] <= k_cap),
        ("work_group_size_16_to_256", ("MDIMD", "NDIMD", "KSL"),
         lambda c: min_threads <= _threads(c) <= 256),
        ("register_tile_at_most_32", ("MWID", "NWID"), lambda c: c["MWID"] * c["NWID"] <= 32),
    ]


def _nearest(space: Space, wanted: Mapping[str, int]) -> Config:
    """The searched config closest to ``wanted`` (sum of |log2| differences, first on ties)."""
    def distance(config: Mapping[str, int]) -> float:
        return sum(abs(math.log2(config[k]) - math.log2(v)) for k, v in wanted.items())
    return min(space.configs(), key=distance)


class GemmDirect(Fp32Gemm):
    """The ``gemm_direct`` algorithm (see the module docstring for its tunables)."""

    name = NAME
    version = VERSION

    def space(self, problem: GemmProblem, device: Device) -> Space:
        check_dtype(NAME, problem, "float32")
        return make_space(dict(_PARAMS), _constraints(problem, device), _pruning(problem, device))

    def default(self, problem: GemmProblem, device: Device) -> Config:
        """256 threads on a GPU: K split 8 ways when both operands are K-contiguous (torch.nn.Linear),
        4 ways for a long K (more work-groups for skinny outputs), else 32 threads along N; 64 threads
        on a CPU. Then the nearest config the problem allows."""
        k_contiguous_b = problem.trans_b
        k_contiguous_a = not problem.trans_a
        ld = problem.k if (k_contiguous_a or k_contiguous_b) else 4
        vwk = widest(ld)
        if device_type(device) != "gpu":
            wanted = {"MDIMD": 4, "NDIMD": 16, "KSL": 1, "MWID": 4, "NWID": 4, "VWK": vwk, "KWID": 1}
        elif k_contiguous_a and k_contiguous_b:
            wanted = {"MDIMD": 4, "NDIMD": 8, "KSL": 8, "MWID": 2, "NWID": 2, "VWK": vwk, "KWID": 2}
        elif problem.k >= 256:
            wanted = {"MDIMD": 8, "NDIMD": 8, "KSL": 4, "MWID": 2, "NWID": 2, "VWK": vwk, "KWID": 2}
        else:
            wanted = {"MDIMD": 8, "NDIMD": 32, "KSL": 1, "MWID": 2, "NWID": 2, "VWK": vwk, "KWID": 2}
        space = self.space(problem, device)
        return dict(wanted) if wanted in space.configs() else _nearest(space, wanted)

    def build(self, problem: GemmProblem, device: Device, config: Config) -> GemmPlan:
        """Compile ``config`` for ``problem``; ValueError (before compiling) if the config is invalid."""
        check_config(self.space(problem, device), config, NAME)
        source = read_source(__package__, "gemm_direct.cl")
        layout = layout_options(problem)

        def options(variant: Variant) -> list[str]:
            aligned_a, aligned_b, _ = variant
            return build_options({**config, "VECA": int(aligned_a), "VECB": int(aligned_b)}, layout)

        c = config
        local = (c["KSL"] * c["NDIMD"], c["MDIMD"], 1)
        glob = (-(-problem.n // (c["NDIMD"] * c["NWID"])) * local[0],
                -(-problem.m // (c["MDIMD"] * c["MWID"])) * local[1], problem.batch)
        # Only K-contiguous operands are loaded with vectors: A not transposed, B transposed.
        widths = (1 if problem.trans_a else c["VWK"], c["VWK"] if problem.trans_b else 1, 1)
        return GemmPlan(algorithm=NAME, problem=problem, device=device, config=config, source=source,
                        options=options, widths=widths, global_size=glob, local_size=local)


ALGORITHMS = [GemmDirect()]
