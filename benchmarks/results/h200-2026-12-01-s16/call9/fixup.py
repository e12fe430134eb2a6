"""Session 16, call 9: gemm_streamk's fixup, one work-group per split tile (calls 2-7) against four outputs
per thread (float4 reads of the parts, kept), each command timed alone (device events, median of 20),
with the kernel alone (TN) at 4096^3 and 4224^2 x 4096, STREAMK 1 and 2.

Run from the repository root: TUNECL_DEVICE=nvidia python fixup.py
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
OLD_FIXUP = "// C = alpha * (the sum of a split tile's parts) + beta * C. Work-group w handles tile dp_tiles + w (a\n// tile that one group computed whole is already in C: nothing to do); its threads walk the tile's\n// MWG x NWG outputs row by row (neighbouring threads, neighbouring addresses).\n__kernel void gemm_streamk_fixup(const int M, const int N, const int K, const float alpha, const float beta,\n                                 const __global float* restrict wgm, const int batches, const int dp_tiles,\n                                 const int sk_groups, __global float* restrict cgm, const long c_offset,\n                                 const int ldc, const long stride_c) {\n  const int ngm = (M + MWG - 1) / MWG;\n  const int ngn = (N + NWG - 1) / NWG;\n  const int per_matrix = ngm * ngn;\n  const int steps = (K + KWG - 1) / KWG;\n  const int t = dp_tiles + get_group_id(0);\n  const long left = (long)(per_matrix * batches - dp_tiles) * steps;\n  const int first = (t - dp_tiles) * steps;  // the tile's k steps, counted from the stream-K base\n  const int last = first + steps - 1;\n  // The group holding step x is the largest j with j * left / sk_groups <= x.\n  const int j_lo = (int)(((long)(first + 1) * sk_groups - 1) / left);\n  const int j_hi = (int)(((long)(last + 1) * sk_groups - 1) / left);\n  if (j_lo == j_hi) {\n    return;\n  }\n  const int batch = t / per_matrix;\n  const int2 tile = gemm_tile_of_index(t - batch * per_matrix, ngm, ngn);\n  const int m0 = tile.x * MWG;\n  const int n0 = tile.y * NWG;\n  cgm += c_offset + batch * stride_c;\n  for (int e = get_local_id(0); e < MWG * NWG; e += get_local_size(0)) {\n    const int m = m0 + e / NWG;\n    const int n = n0 + e % NWG;\n    if (m < M && n < N) {\n      float sum = 0.0f;\n      for (int j = j_lo; j <= j_hi; ++j) {\n        const int jb = (int)(j * left / sk_groups);\n        if (jb == (int)((j + 1) * left / sk_groups)) {\n          continue;  // a group without steps wrote nothing\n        }\n        const long slot = 2 * (long)j + (jb < first);  // the group's first segment, or its second\n        sum += wgm[slot * (MWG * NWG) + e];\n      }\n      float r = alpha * sum;\n      if (beta != 0.0f) { r = fma(beta, cgm[m * ldc + n], r); }\n      cgm[m * ldc + n] = r;\n    }\n  }\n}\n"


def old_fixup(plan):
    """The first fixup: one work-group of 256 threads per split tile."""
    start = plan._source.index("// C = alpha * (the sum of a split tile's parts)")
    end = plan._source.index("#endif  // STREAMK")
    source = plan._source[:start] + OLD_FIXUP + plan._source[end:]
    variant = next(iter(plan._kernels))
    program = dev.build(source, plan._options(variant))
    from tunecl.kernels.gemm import FIXUP_SCALAR_DTYPES
    plan._fixup = dev.kernel(program, "gemm_streamk_fixup", FIXUP_SCALAR_DTYPES)
    plan._fixup_global = (plan._fixup_global[0] * 256 // (W["MWG"] * W["NWG"] // 4),)  # 256 per split tile


for m, n in [(4096, 4096), (4224, 4224)]:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((K, m), dtype=np.float32)
    b = rng.standard_normal((K, n), dtype=np.float32)
    A, B, C = dev.upload(a), dev.upload(b), dev.alloc(4 * m * n)
    ref = torch.from_numpy(a).cuda().double().t() @ torch.from_numpy(b).cuda().double()
    for streamk in (1, 2):
        for form in ("new", "old", "new again"):
            plan = alg.build(GemmProblem(m=m, n=n, k=K, trans_a=True), dev, {**W, "STREAMK": streamk})
            if form == "old":
                old_fixup(plan)
            for _ in range(3):
                ev = plan.run(A, B, C)
            ev[-1].wait()
            main, fix, span = [], [], []
            for _ in range(20):
                ev = plan.run(A, B, C); ev[-1].wait()
                main.append((ev[0].profile.end - ev[0].profile.start) * 1e-6)
                fix.append((ev[-1].profile.end - ev[-1].profile.start) * 1e-6)
                span.append((ev[-1].profile.end - ev[0].profile.start) * 1e-6)
            err = float((torch.from_numpy(dev.download(C, (m, n))).cuda().double() - ref).abs().max())
            print(json.dumps({"m": m, "n": n, "k": K, "streamk": streamk, "split": plan.streamk, "fixup": form,
                              "fixup_global": plan._fixup_global, "main_ms": round(statistics.median(main), 4),
                              "fixup_ms": round(statistics.median(fix), 4), "gap_and_all_ms": round(statistics.median(span), 4),
                              "maxerr_vs_fp64": err}), flush=True)
