"""gemm_tiled's searched configs for one problem on one (fake) device, enumerated once per process for
every test module that draws random configs from them (test_gemm.py, test_gemm_splitk.py and
test_gemm_async.py draw from the same spaces; enumerating one layout's takes seconds).

The space without the cp.async configs is, once the space with them has been enumerated, that list less
its ASYNC configs, in the same order (the enumeration is depth-first in parameter order, so under every
prefix ASYNC=0 heads the same subtree the space without cp.async enumerates); else it is enumerated alone
(it is the smaller one).
"""

from __future__ import annotations

from tunecl.kernels import gemm
from tunecl.problems import GemmProblem

TILED = gemm.GemmTiled()
_enumerated: dict[tuple[str, str, bool], list[dict[str, int]]] = {}


def tiled_configs(problem: GemmProblem, device, async_copies: bool) -> list[dict[str, int]]:
    """``TILED._space(problem, device, async_copies).configs()``, computed once per process."""
    key = (problem.key, repr(device), async_copies)
    if key not in _enumerated:
        with_async = _enumerated.get((problem.key, repr(device), True))
        if not async_copies and with_async is not None:
            _enumerated[key] = [c for c in with_async if not c["ASYNC"]]
        else:
            _enumerated[key] = TILED._space(problem, device, async_copies).configs()
    return _enumerated[key]
