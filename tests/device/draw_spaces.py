"""gemm_tiled's searched configs for one problem on one (fake) device, enumerated once per process for
every test module that draws random configs from them (test_gemm.py, test_gemm_splitk.py,
test_gemm_async.py draw from the same spaces; enumerating one layout's takes seconds).

The space is enumerated with the cp.async configs (ASYNC 2, 3, 4) included; the space without them is
that list less its ASYNC configs, in the same order (the enumeration is depth-first in parameter order,
so under every prefix ASYNC=0 heads the same subtree the space without cp.async enumerates).
"""

from __future__ import annotations

from tunecl.kernels import gemm
from tunecl.problems import GemmProblem

TILED = gemm.GemmTiled()
_enumerated: dict[tuple[str, str], list[dict[str, int]]] = {}


def tiled_configs(problem: GemmProblem, device, async_copies: bool) -> list[dict[str, int]]:
    """``TILED._space(problem, device, async_copies).configs()``, computed once per process."""
    key = (problem.key, repr(device))
    if key not in _enumerated:
        _enumerated[key] = TILED._space(problem, device, True).configs()
    configs = _enumerated[key]
    return configs if async_copies else [c for c in configs if not c["ASYNC"]]
