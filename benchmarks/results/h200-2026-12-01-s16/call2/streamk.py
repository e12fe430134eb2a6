"""Session 16, call 2: the stream-K tail (gemm_tiled STREAMK) against the shipped 4096^3 config.

Per shape: the shipped config with STREAMK 0 (plain) and 1-4 (stream-K work-groups per SM), timed from
the first command's start to the last one's end (device events, median of 20), on the TN layout (the
kernel alone) and the NN layout (the whole plan: A's transpose, the tiles, the fixup), next to torch.mm
on the same layout (cuBLAS, TF32 off, CUDA events, median of 20) timed in between. The error is against
torch.mm in float64; registers of each kernel from -cl-nv-verbose.

Run from the repository root: TUNECL_DEVICE=nvidia python streamk.py
"""
import json, re, statistics
import numpy as np
import pyopencl as cl
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


def span(events):
    return (events[-1].profile.end - events[0].profile.start) * 1e-6


def timed_cl(run, reps=20):
    for _ in range(3):
        ev = run()
    ev[-1].wait()
    ts = []
    for _ in range(reps):
        ev = run(); ev[-1].wait()
        ts.append(span(ev))
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


def registers(plan):
    inner = getattr(plan, "inner", plan)
    variant = next(iter(inner._kernels))
    prog = cl.Program(dev.context, inner._source).build(options=list(inner._options(variant)) + ["-cl-nv-verbose"])
    log = prog.get_build_info(dev.cl_device, cl.program_build_info.LOG)
    return dict(re.findall(r"Compiling entry function '(\w+)'.*?Used (\d+) registers", log, re.S))


def case(m, n, trans_a, variants, reps=20):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((K, m) if trans_a else (m, K), dtype=np.float32)
    b = rng.standard_normal((K, n), dtype=np.float32)
    A, B, C = dev.upload(a), dev.upload(b), dev.alloc(4 * m * n)
    ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    op = (lambda: torch.mm(ta.t(), tb)) if trans_a else (lambda: torch.mm(ta, tb))
    ref = (ta.t().double() if trans_a else ta.double()) @ tb.double()
    fl = 2 * m * n * K / 1e9
    for name, change in variants:
        row = {"m": m, "n": n, "k": K, "layout": "tn" if trans_a else "nn", "variant": name}
        try:
            plan = alg.build(GemmProblem(m=m, n=n, k=K, trans_a=trans_a), dev, {**W, **change})
            inner = getattr(plan, "inner", plan)
            row["streamk"] = inner.streamk
            row["cublas_ms_before"] = round(timed_torch(op, reps), 4)
            ms = timed_cl(lambda: plan.run(A, B, C), reps)
            row["cublas_ms_after"] = round(timed_torch(op, reps), 4)
            cub = min(row["cublas_ms_before"], row["cublas_ms_after"])
            row.update(ours_ms=round(ms, 4), ours_tflops=round(fl / ms, 2), ratio_vs_cublas=round(cub / ms, 4))
            got = torch.from_numpy(dev.download(C, (m, n))).cuda().double()
            row["maxerr_vs_fp64"] = float((got - ref).abs().max())
            row["cublas_maxerr_vs_fp64"] = float((op().double() - ref).abs().max())
            row["registers"] = registers(plan)
        except Exception as e:  # noqa: BLE001 - a diagnosis: record and go on
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        print(json.dumps(row), flush=True)


ALL = [("shipped", {})] + [(f"STREAMK {s}", {"STREAMK": s}) for s in (1, 2, 3, 4)] + [
    ("STREAMK 2 MAXRREG 128", {"STREAMK": 2, "MAXRREG": 128}), ("shipped again", {})]
case(4096, 4096, True, ALL)
case(4096, 4096, False, [("shipped", {}), ("STREAMK 2", {"STREAMK": 2}), ("STREAMK 3", {"STREAMK": 3}),
                         ("shipped again", {}), ("STREAMK 2 again", {"STREAMK": 2})])
TWO = [("shipped", {}), ("STREAMK 2", {"STREAMK": 2})]
for m, n in [(4096, 4352), (1024, 4352), (4224, 4224), (8192, 8192), (2048, 2048), (1024, 1024)]:
    case(m, n, True, TWO, reps=10)
