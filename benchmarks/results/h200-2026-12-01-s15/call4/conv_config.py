"""Session 15, call 4: the conv_implicit_gemm config that computes wrong on PyPI's PoCL 3.0-rc2 (and right on
the distribution's PoCL 3.1), run on this machine's default device in every direction on four shapes of
tests/device/test_conv.py, with the error bound of that test.

Run from the repository root: TUNECL_DEVICE=nvidia python benchmarks/results/h200-2026-12-01-s15/call4/conv_config.py
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from tests.device.test_conv import ALGORITHMS, check, problem  # noqa: E402
from tunecl import runtime  # noqa: E402

device = runtime.select_device()
config = {"MWG": 16, "NWG": 16, "KWG": 8, "MDIMC": 16, "NDIMC": 4, "VWM": 1, "VWN": 1, "SPLIT": 1, "LPAD": 1,
          "PREFETCH": 0}
algorithm = ALGORITHMS["conv_implicit_gemm"]
print(device)
for direction in ("fwd", "bwd_data", "bwd_weight"):
    for shape in ("3x3_p2_dil2", "3x3_s1_odd", "3x3_s2", "groups2"):
        p = problem(shape, direction)
        if not algorithm.space(p, device).is_valid(config):
            print(direction, shape, "not valid here")
            continue
        try:
            check(device, algorithm, p, config, beta=0.0, use_bias=direction == "fwd", seed=0)
            print(direction, shape, "ok")
        except AssertionError as error:
            print(direction, shape, "WRONG", str(error)[:300])
