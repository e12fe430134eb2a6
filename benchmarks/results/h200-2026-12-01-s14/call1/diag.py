"""Session 14, call 1: variants of the shipped 4096^3 gemm_tiled ASYNC config (TN layout: no transpose,
so the kernel alone is timed), their register counts (-cl-nv-verbose), candidate transpose kernels, and
the torch CUDA peers (cuBLAS mm with TF32 off, a.t().contiguous()) in the same process.

Run from the repository root: TUNECL_DEVICE=nvidia python diag.py
"""
import json, re, statistics
import numpy as np
import pyopencl as cl
import tunecl.kernels.gemm as gemm
from tunecl import runtime
from tunecl.kernels import algorithm
from tunecl.problems import GemmProblem

base_params = gemm._params
def wider(device, async_copies):  # values outside the searched space, for this diagnosis only
    p = dict(base_params(device, async_copies))
    p["GM"] = (1, 4, 8, 16); p["KWI"] = (2, 4, 8); p["MAXRREG"] = (0, 96, 112, 128, 144, 168, 192)
    return p
gemm._params = wider

dev = runtime.select_device("nvidia")
n = 4096
W = {"MWG": 128, "NWG": 128, "KWG": 8, "SPLITK": 1, "MDIMC": 16, "NDIMC": 16, "VWM": 1, "VWN": 4, "STRM": 0,
     "STRN": 1, "KWI": 8, "SA": 1, "SB": 1, "ASYNC": 4, "MDIMA": 32, "NDIMB": 32, "VWA": 4, "VWB": 4, "DB": 0,
     "PAD": 0, "GM": 8, "RWGS": 0, "MAXRREG": 168}
V = [("shipped", {})]
V += [(f"MAXRREG {r}", {"MAXRREG": r}) for r in (0, 128, 144, 192)]
V += [("VWM 4", {"VWM": 4}), ("VWM 4 STRM 1", {"VWM": 4, "STRM": 1}), ("VWM 2", {"VWM": 2}),
      ("VWM 4 STRN 0", {"VWM": 4, "STRN": 0})]
V += [("ASYNC 3", {"ASYNC": 3}), ("ASYNC 2", {"ASYNC": 2}),
      ("KWG 16 ASYNC 2", {"KWG": 16, "ASYNC": 2, "MDIMA": 32, "NDIMB": 32}),
      ("KWG 16 ASYNC 3", {"KWG": 16, "ASYNC": 3})]
V += [(f"GM {g}", {"GM": g}) for g in (1, 4, 16)]
V += [("KWI 2", {"KWI": 2}), ("KWI 4", {"KWI": 4})]
big = {"MWG": 256, "NWG": 128, "MDIMC": 32, "NDIMC": 16, "MDIMA": 64, "NDIMB": 64, "VWB": 2}
V += [(f"256x128 512 thr MAXRREG {r} ASYNC {s}", {**big, "MAXRREG": r, "ASYNC": s}) for r in (128, 0) for s in (3, 4)]
big2 = {"MWG": 128, "NWG": 256, "MDIMC": 16, "NDIMC": 32, "MDIMA": 64, "VWA": 2, "NDIMB": 64}
V += [(f"128x256 512 thr MAXRREG 128 ASYNC {s}", {**big2, "MAXRREG": 128, "ASYNC": s}) for s in (3, 4)]
V += [("128x256 256 thr 8x16 MAXRREG 0 ASYNC 3", {"NWG": 256, "MAXRREG": 0, "NDIMB": 64, "ASYNC": 3}),
      ("128x256 256 thr 8x16 MAXRREG 0 ASYNC 3 VWM 4", {"NWG": 256, "MAXRREG": 0, "NDIMB": 64, "ASYNC": 3, "VWM": 4})]

rng = np.random.default_rng(0)
A, B, C = (dev.upload(rng.standard_normal((n, n), dtype=np.float32)) for _ in range(3))
alg = algorithm("gemm_tiled")
p = GemmProblem(m=n, n=n, k=n, trans_a=True, trans_b=False)


def timed(run, reps=20):
    for _ in range(3):
        ev = run()
    ev[-1].wait()
    ts = []
    for _ in range(reps):
        ev = run(); ev[-1].wait()
        ts.append((ev[-1].profile.end - ev[-1].profile.start) * 1e-6)
    return statistics.median(ts)


ref = None
for name, change in V:
    cfg = {**W, **change}
    row = {"name": name, "config": change}
    try:
        plan = alg.build(p, dev, cfg)
        variant = next(iter(plan._kernels))
        opts = plan._options(variant)
        prog = cl.Program(dev.context, plan._source).build(options=list(opts) + ["-cl-nv-verbose"])
        log = prog.get_build_info(dev.cl_device, cl.program_build_info.LOG)
        regs = re.findall(r"Used (\d+) registers", log)
        spill = re.findall(r"(\d+) bytes spill stores", log)
        row["regs"] = int(regs[-1]) if regs else None
        row["spill_stores"] = int(spill[-1]) if spill else None
        row["ms"] = timed(lambda: plan.run(A, B, C))
        out = dev.download(C, (n, n))
        if ref is None:
            ref = out.astype(np.float64)
        row["maxdiff_vs_shipped"] = float(np.abs(out - ref).max())
        row["tflops"] = 2 * n**3 / row["ms"] / 1e9
    except Exception as e:  # noqa: BLE001 - a diagnosis: record and go on
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    print(json.dumps(row), flush=True)

# ---- transposes of a 4096 x 4096 fp32 matrix ------------------------------------------------------
TSRC = r"""
__kernel __attribute__((reqd_work_group_size(32, 8, 1)))
void t32(__global const float* in, __global float* out, const int rows, const int cols) {
  __local float tile[32][33];
  const int tx = get_local_id(0), ty = get_local_id(1);
  const int c0 = get_group_id(0) * 32, r0 = get_group_id(1) * 32;
  for (int j = ty; j < 32; j += 8) tile[j][tx] = in[(long)(r0 + j) * cols + c0 + tx];
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int j = ty; j < 32; j += 8) out[(long)(c0 + j) * rows + r0 + tx] = tile[tx][j];
}
// 64 x 64 tile, 16 x 16 threads, float4 reads along c and float4 writes along r.
__kernel __attribute__((reqd_work_group_size(16, 16, 1)))
void t64v4(__global const float* in, __global float* out, const int rows, const int cols) {
  __local float tile[64][65];
  const int tx = get_local_id(0), ty = get_local_id(1);
  const int c0 = get_group_id(0) * 64, r0 = get_group_id(1) * 64;
  for (int j = 0; j < 4; ++j) {
    const int r = ty + 16 * j;
    float4 v = *(__global const float4*)(in + (long)(r0 + r) * cols + c0 + 4 * tx);
    tile[r][4 * tx] = v.x; tile[r][4 * tx + 1] = v.y; tile[r][4 * tx + 2] = v.z; tile[r][4 * tx + 3] = v.w;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int j = 0; j < 4; ++j) {
    const int c = ty + 16 * j;
    float4 v = (float4)(tile[4 * tx][c], tile[4 * tx + 1][c], tile[4 * tx + 2][c], tile[4 * tx + 3][c]);
    *(__global float4*)(out + (long)(c0 + c) * rows + r0 + 4 * tx) = v;
  }
}
// 32 x 32 tile, 8 x 32 threads: float4 reads along c, scalar writes (32 consecutive r per warp).
__kernel __attribute__((reqd_work_group_size(8, 32, 1)))
void t32v4r(__global const float* in, __global float* out, const int rows, const int cols) {
  __local float tile[32][33];
  const int tx = get_local_id(0), ty = get_local_id(1);
  const int c0 = get_group_id(0) * 32, r0 = get_group_id(1) * 32;
  float4 v = *(__global const float4*)(in + (long)(r0 + ty) * cols + c0 + 4 * tx);
  tile[ty][4 * tx] = v.x; tile[ty][4 * tx + 1] = v.y; tile[ty][4 * tx + 2] = v.z; tile[ty][4 * tx + 3] = v.w;
  barrier(CLK_LOCAL_MEM_FENCE);
  const int lin = ty * 8 + tx, rr = lin % 32, cc = lin / 32;
  for (int j = 0; j < 4; ++j) out[(long)(c0 + cc + 8 * j) * rows + r0 + rr] = tile[rr][cc + 8 * j];
}
// 64 x 64 tile, 32 x 8 threads, float2 reads and writes.
__kernel __attribute__((reqd_work_group_size(32, 8, 1)))
void t64v2(__global const float* in, __global float* out, const int rows, const int cols) {
  __local float tile[64][65];
  const int tx = get_local_id(0), ty = get_local_id(1);
  const int c0 = get_group_id(0) * 64, r0 = get_group_id(1) * 64;
  for (int j = 0; j < 8; ++j) {
    const int r = ty + 8 * j;
    float2 v = *(__global const float2*)(in + (long)(r0 + r) * cols + c0 + 2 * tx);
    tile[r][2 * tx] = v.x; tile[r][2 * tx + 1] = v.y;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int j = 0; j < 8; ++j) {
    const int c = ty + 8 * j;
    *(__global float2*)(out + (long)(c0 + c) * rows + r0 + 2 * tx) = (float2)(tile[2 * tx][c], tile[2 * tx + 1][c]);
  }
}
"""
tprog = cl.Program(dev.context, TSRC).build()
src = rng.standard_normal((n, n), dtype=np.float32)
S = dev.upload(src)
O = dev.alloc(4 * n * n)
q = dev.queue
from tunecl.kernels.transpose import Transpose
shipped = Transpose(dev)
cases = [("shipped transpose.cl", lambda: [shipped.run(S, 0, n, 0, n, n, 1, O)])]
for name, glob, loc in [("t32", (n, n // 4), (32, 8)), ("t64v4", (n // 4, n // 4), (16, 16)),
                        ("t32v4r", (n // 4, n), (8, 32)), ("t64v2", (n // 2, n // 8), (32, 8))]:
    k = getattr(tprog, name)
    cases.append((name, lambda k=k, glob=glob, loc=loc: [k(q, glob, loc, S, O, np.int32(n), np.int32(n))]))
cases.append(("copy buffer (reference)", lambda: [cl.enqueue_copy(q, O, S)]))
for name, run in cases:
    ms = timed(run, 30)
    ok = None
    if "copy" not in name:
        ok = bool(np.array_equal(dev.download(O, (n, n)), src.T))
    print(json.dumps({"transpose": name, "ms": ms, "TB/s": 2 * 4 * n * n / ms / 1e9, "correct": ok}), flush=True)

# ---- torch CUDA peers -------------------------------------------------------------------------------
import torch
torch.backends.cuda.matmul.allow_tf32 = False
a = torch.randn(n, n, device="cuda"); b = torch.randn(n, n, device="cuda")
def cuda_ms(fn, reps=30):
    for _ in range(5): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); e.synchronize(); ts.append(s.elapsed_time(e))
    return statistics.median(ts)
print(json.dumps({"peer": "torch.mm fp32 (TF32 off)", "ms": cuda_ms(lambda: torch.mm(a, b))}), flush=True)
print(json.dumps({"peer": "a.t().contiguous()", "ms": cuda_ms(lambda: a.t().contiguous())}), flush=True)
print(json.dumps({"peer": "torch.mm fp32 again", "ms": cuda_ms(lambda: torch.mm(a, b))}), flush=True)
