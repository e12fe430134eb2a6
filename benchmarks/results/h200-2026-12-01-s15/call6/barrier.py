"""Session 15, call 6: conv_implicit_gemm with its K-loop barrier at the end of a step (as shipped now)
against the barrier at the start of the next step (before), on resnet50-like problems in every direction,
default and seeded random configs: device-event times (median of 20, two interleaved rounds, best round)
and whether the two results are equal bit for bit.

Run from the repository root: TUNECL_DEVICE=nvidia python benchmarks/results/h200-2026-12-01-s15/call6/barrier.py
"""
import random
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from tunecl import runtime  # noqa: E402
from tunecl.kernels import conv_common  # noqa: E402
from tunecl.kernels.conv_implicit_gemm import ConvImplicitGemm  # noqa: E402
from tunecl.problems import ConvProblem  # noqa: E402
from tunecl.search.harness_conv import operand_shapes  # noqa: E402

NEW_LOOP = "  for (int k0 = k_begin; k0 < k_end; k0 += KWG) {\n    // PrivateToLocal"
OLD_LOOP = "  for (int k0 = k_begin; k0 < k_end; k0 += KWG) {\n    barrier(CLK_LOCAL_MEM_FENCE);\n    // PrivateToLocal"
NEW_END = "    barrier(CLK_LOCAL_MEM_FENCE);\n  }\n\n  // ---- StoreC"
OLD_END = "  }\n\n  // ---- StoreC"
original = conv_common.read_source
variant = {"now": "new"}


def read_source(package, filename):
    text = original(package, filename)
    if filename == "conv_implicit_gemm.cl" and variant["now"] == "old":
        assert text.count(NEW_LOOP) == 1 and text.count(NEW_END) == 1, "the kernel changed: update this script"
        text = text.replace(NEW_LOOP, OLD_LOOP).replace(NEW_END, OLD_END)
    return text


conv_common.read_source = read_source
device = runtime.select_device()
algorithm = ConvImplicitGemm()
SHAPES = ["n=16,c=64,h=56,w=56,k=64,r=3,s=3,pad=1", "n=16,c=128,h=28,w=28,k=128,r=3,s=3,pad=1",
          "n=16,c=256,h=14,w=14,k=256,r=3,s=3,pad=1", "n=16,c=512,h=7,w=7,k=2048,r=1,s=1"]
rng = np.random.default_rng(0)
print(device)
for spec in SHAPES:
    for direction in ("fwd", "bwd_data", "bwd_weight"):
        p = ConvProblem.parse(spec).with_direction(direction)
        if not algorithm.applies(p, device):
            continue
        configs = [algorithm.default(p, device)] + random.Random(spec + direction).sample(
            algorithm.space(p, device).configs(), 2)
        a_shape, b_shape, out_shape = operand_shapes(p)
        a = device.upload(rng.uniform(-1, 1, a_shape).astype(np.float32))
        b = device.upload(rng.uniform(-1, 1, b_shape).astype(np.float32))
        out = device.alloc(4 * int(np.prod(out_shape)))
        for index, config in enumerate(configs):
            plans, results, times = {}, {}, {"old": [], "new": []}
            try:
                for which in ("old", "new"):
                    variant["now"] = which
                    plans[which] = algorithm.build(p, device, config)
            except Exception as error:  # noqa: BLE001 - a config this GPU cannot launch: say so, go on
                print(f"{direction:10s} {spec:42s} config {index}: {type(error).__name__}")
                continue
            for _ in range(2):
                for which, plan in plans.items():
                    for _ in range(3):
                        plan.run(a, b, out)
                    device.synchronize()
                    ms = []
                    for _ in range(20):
                        events = plan.run(a, b, out)
                        events[-1].wait()
                        ms.append((events[-1].profile.end - events[0].profile.start) * 1e-6)
                    times[which].append(statistics.median(ms))
                    results[which] = device.download(out, out_shape)
            same = np.array_equal(results["old"], results["new"])
            old, new = min(times["old"]), min(times["new"])
            print(f"{direction:10s} {spec:42s} config {index}: before {old:.4f} ms, now {new:.4f} ms, "
                  f"now/before {new / old:.3f}, equal: {same}", flush=True)
