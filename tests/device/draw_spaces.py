"""Where the GEMM tests draw random configs from: each family's searched configs for DRAW_SHAPE on a
GPU-like device, enumerated once per run for every test module and process that draws from them (kept
in the suite's kernel cache folder; enumerating one of gemm_tiled's takes seconds), and the seeded
draws themselves (``random_config``: what test_gemm_contract.py runs, and what the families'
own tests check the variety of).

A family that applies without any capability draws from what a GPU without PTX searches (DRAW_DEVICE,
vendor-neutral: no NVIDIA build options, which keeps small tiles that the 2-core CPU's space prunes; its
limits are stricter than PoCL's); a tensor-core family from what a GPU with every capability searches
(EVERY_CAPABILITY, an H200's limits). Two families mix in a part of their space those draws rarely
reach: every eighth gemm_tiled draw is among its unstaged configs (SA = 0, a few % of the space), every
third gemm_simt draw comes from a CPU's space (16-lane warps, VW < 4).

gemm_tiled's space without the cp.async configs is the space with them less its ASYNC configs, in the same
order (the enumeration is depth-first in parameter order, so under every prefix ASYNC=0 heads the same
subtree the space without cp.async enumerates): a run of the GEMM tests enumerates the one with them
(test_gemm_async.py draws from it), and the draws of gemm_tiled's searched configs filter it.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path
from typing import Any

import draws
import numpy as np
from gemm_checks import TRANSPOSES, gpu_double, problem

from tunecl import config, runtime
from tunecl.kernels.gemm import core, gemm_tiled
from tunecl.kernels.base import Space
from tunecl.problems import DTYPES, GemmProblem

TILED = gemm_tiled.GemmTiled()
DRAW_SHAPE = (2048, 256, 256)  # tiles up to 256 fit, vector loads fit, several GM bands
CAPABILITIES = frozenset({runtime.MMA_TF32, runtime.MMA_F16, runtime.CP_ASYNC, runtime.WGMMA})
DRAW_DEVICE = gpu_double(vendor="Generic")
EVERY_CAPABILITY = gpu_double(capabilities=CAPABILITIES)
# 48 KiB like DRAW_DEVICE: every drawn config must fit the smallest local memory the tests run on (the H200's)
CPU_LIKE = gpu_double(vendor="Generic", device_type="cpu")
# the draws checked against numpy per family: RANDOM_PER_RUN[name] (else RANDOM_PER_RUN_OTHER) of 1000 per
# run, drawn with the day's seed; the first RANDOM_FULL with TUNECL_RANDOM_CONFIGS=full (tests/draws.py).
# Per run, each family draws as many as its cost allows (a tensor-core config compiles emulated, slowest).
RANDOM_PER_RUN = {"gemm_tiled": 4, "gemm_direct": 8, "gemm_simt": 3}
RANDOM_PER_RUN_OTHER, RANDOM_FULL = 2, 32
_enumerated: dict[tuple[str, str, str], list[dict[str, int]]] = {}


def picks(name: str, at_least: int = 0) -> draws.Picks:
    """Which of family ``name``'s draws (``random_config``) run today: those test_gemm_contract.py runs,
    extended to ``at_least`` (the day's sample with more numbers starts with the same ones)."""
    per_run = max(at_least, RANDOM_PER_RUN.get(name, RANDOM_PER_RUN_OTHER))
    return draws.Picks(f"gemm/{name}", per_run=per_run, full=RANDOM_FULL)


def _kernel_sources_digest() -> str:
    """A digest of the kernel families' Python sources, which define their spaces."""
    digest = hashlib.sha256()
    for path in sorted(Path(gemm_tiled.__file__).parent.glob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


_SOURCES = _kernel_sources_digest()


def _stored(space: Space, key: tuple[str, ...]) -> list[dict[str, int]]:
    """``space.configs()``, kept in the suite's kernel cache folder (``TUNECL_CACHE_DIR``) under a digest
    of ``key`` and of the families' sources, so that the test processes of a run (pytest-xdist workers)
    enumerate each space once between them."""
    name = hashlib.sha256("/".join((_SOURCES, *key)).encode()).hexdigest()[:32]
    path = Path(config.get().cache_dir) / "test-spaces" / f"{name}.npy"
    params = list(space.params)
    try:
        rows = np.load(path)
    except (OSError, ValueError):
        configs = space.configs()
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.npy")
        np.save(partial, np.array([[c[n] for n in params] for c in configs], dtype=np.uint16).reshape(-1, len(params)))
        os.replace(partial, path)
        return configs
    return [dict(zip(params, map(int, row), strict=True)) for row in rows]


def tiled_configs(p: GemmProblem, device, async_copies: bool) -> list[dict[str, int]]:
    """``TILED._space(p, device, async_copies).configs()``, computed once per run (module docstring)."""
    key = (p.key, repr(device), str(async_copies))
    if key not in _enumerated:
        if async_copies:
            _enumerated[key] = _stored(TILED._space(p, device, True), (TILED.name, *key))
        else:
            _enumerated[key] = [c for c in tiled_configs(p, device, True) if not c["ASYNC"]]
    return _enumerated[key]


def searched_configs(algorithm: Any, p: GemmProblem, device) -> list[dict[str, int]]:
    """``algorithm.space(p, device).configs()``, computed once per run."""
    if algorithm.name == TILED.name:
        return tiled_configs(p, device, runtime.CP_ASYNC in core.capabilities(device))
    key = (algorithm.name, p.key, repr(device))
    if key not in _enumerated:
        _enumerated[key] = _stored(algorithm.space(p, device), key)
    return _enumerated[key]


def dtype_of(algorithm: Any) -> str:
    """The dtype of the problems ``algorithm`` computes (where every capability is granted)."""
    [dtype] = [d for d in DTYPES if algorithm.applies(GemmProblem(64, 64, 64, dtype=d), EVERY_CAPABILITY)]
    return dtype


def target(algorithm: Any):
    """The GPU-like device whose searched configs ``algorithm``'s draws come from (module docstring)."""
    return DRAW_DEVICE if algorithm.applies(GemmProblem(64, 64, 64, dtype=dtype_of(algorithm)), DRAW_DEVICE) \
        else EVERY_CAPABILITY


def random_config(algorithm: Any, index: int, attempt: int = 0) -> tuple[tuple[bool, bool], dict[str, int]]:
    """Draw ``index`` of ``algorithm``'s seeded random configs (``attempt`` > 0: the next ones, for a
    device that cannot run the first): (the transposes it is drawn and run for, the config)."""
    transposes = TRANSPOSES[index % 4]
    device = CPU_LIKE if algorithm.name == "gemm_simt" and index % 3 == 2 else target(algorithm)
    configs = searched_configs(algorithm, problem(DRAW_SHAPE, transposes, dtype=dtype_of(algorithm)), device)
    if algorithm.name == TILED.name and index % 8 == 7:
        configs = [c for c in configs if c["SA"] == 0]
    return transposes, random.Random(f"{algorithm.name}/{index}/{attempt}").choice(configs)
