"""Session 16, call 1: does the 4096^3 gemm_tiled winner lose time to its last, partly filled wave?

The shipped 4096^3 config (128x128 tiles, 119 registers: two 256-thread work-groups per SM, 264 slots on
132 SMs) on the TN layout (no transpose: the kernel alone, device events, median of 20) over shapes whose
tile counts fill the slots to different fractions, next to torch.mm on the same layout (cuBLAS, TF32 off,
CUDA events, median of 20), and the cuBLAS kernel names from torch's profiler.

Run from the repository root: TUNECL_DEVICE=nvidia python waves.py
"""
import json, statistics
import numpy as np
import torch
from tunecl import runtime
from tunecl.kernels import algorithm
from tunecl.problems import GemmProblem

torch.backends.cuda.matmul.allow_tf32 = False
dev = runtime.select_device("nvidia")
W = {"MWG": 128, "NWG": 128, "KWG": 8, "SPLITK": 1, "MDIMC": 16, "NDIMC": 16, "VWM": 1, "VWN": 4, "STRM": 0,
     "STRN": 1, "KWI": 8, "SA": 1, "SB": 1, "ASYNC": 4, "MDIMA": 32, "NDIMB": 32, "VWA": 4, "VWB": 4, "DB": 0,
     "PAD": 0, "GM": 8, "RWGS": 0, "MAXRREG": 168}
alg = algorithm("gemm_tiled")
K = 4096
shapes = [(512, 4224), (1024, 4224), (1024, 4352), (1536, 4224), (4096, 3968), (4096, 4096), (4096, 4224),
          (4224, 4224), (4096, 4352), (4096, 8192), (8192, 8192)]


def timed_cl(run, reps=20):
    for _ in range(3):
        ev = run()
    ev[-1].wait()
    ts = []
    for _ in range(reps):
        ev = run(); ev[-1].wait()
        ts.append((ev[-1].profile.end - ev[-1].profile.start) * 1e-6)
    return statistics.median(ts)


def timed_torch(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); e.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts)


rng = np.random.default_rng(0)
for m, n in shapes:
    a = rng.standard_normal((K, m), dtype=np.float32)
    b = rng.standard_normal((K, n), dtype=np.float32)
    A, B, C = dev.upload(a), dev.upload(b), dev.alloc(4 * m * n)
    plan = alg.build(GemmProblem(m=m, n=n, k=K, trans_a=True, trans_b=False), dev, W)
    ms = timed_cl(lambda: plan.run(A, B, C))
    ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    tms = timed_torch(lambda: torch.mm(ta.t(), tb))
    diff = float((torch.from_numpy(dev.download(C, (m, n))).cuda() - torch.mm(ta.t(), tb)).abs().max())
    tiles = -(-m // 128) * -(-n // 128)
    fl = 2 * m * n * K / 1e9
    print(json.dumps({"m": m, "n": n, "k": K, "tiles": tiles, "waves_at_264": round(tiles / 264, 3),
                      "ours_ms": round(ms, 4), "ours_tflops": round(fl / ms, 2), "cublas_ms": round(tms, 4),
                      "cublas_tflops": round(fl / tms, 2), "ratio": round(tms / ms, 4), "maxdiff": diff}), flush=True)
    del A, B, C, plan, ta, tb

from torch.profiler import profile, ProfilerActivity
a = torch.randn(4096, 4096, device="cuda"); b = torch.randn(4096, 4096, device="cuda")
for name, fn in [("nn", lambda: torch.mm(a, b)), ("tn", lambda: torch.mm(a.t(), b))]:
    fn(); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(); torch.cuda.synchronize()
    print(name, [e.name for e in prof.events() if e.device_type.name == "CUDA"], flush=True)
