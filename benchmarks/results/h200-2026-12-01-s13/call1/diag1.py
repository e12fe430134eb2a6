import statistics, sys, numpy as np
from tunecl import runtime
from tunecl.kernels import algorithm
from tunecl.problems import GemmProblem
dev = runtime.select_device("nvidia")
cfg = {"MWG": 128, "NWG": 128, "KWG": 8, "SPLITK": 1, "MDIMC": 16, "NDIMC": 16, "VWM": 1, "VWN": 4, "STRM": 0, "STRN": 1, "KWI": 8, "SA": 1, "SB": 1, "ASYNC": 4, "MDIMA": 32, "NDIMB": 32, "VWA": 4, "VWB": 4, "DB": 0, "PAD": 0, "GM": 8, "RWGS": 0, "MAXRREG": 168}
alg = algorithm("gemm_tiled")
n = 4096
rng = np.random.default_rng(0)
a = dev.alloc(4*n*n); b = dev.alloc(4*n*n); c = dev.alloc(4*n*n)
import pyopencl as cl
cl.enqueue_copy(dev.queue, a, rng.standard_normal((n, n), dtype=np.float32))
cl.enqueue_copy(dev.queue, b, rng.standard_normal((n, n), dtype=np.float32))
for ta, tb in [(0, 0), (1, 0), (0, 1), (1, 1)]:
    p = GemmProblem(m=n, n=n, k=n, trans_a=bool(ta), trans_b=bool(tb))
    plan = alg.build(p, dev, cfg)
    parts = []
    for _ in range(5): plan.run(a, b, c)
    dev.queue.finish()
    for _ in range(30):
        ev = plan.run(a, b, c); ev[-1].wait()
        parts.append([ (e.profile.end - e.profile.start) * 1e-6 for e in ev] + [(ev[-1].profile.end - ev[0].profile.start) * 1e-6])
    med = [statistics.median(x) for x in zip(*parts)]
    print(f"ta={ta} tb={tb} events={len(parts[0])-1} per-event ms={['%.4f' % x for x in med[:-1]]} span ms={med[-1]:.4f}", flush=True)
