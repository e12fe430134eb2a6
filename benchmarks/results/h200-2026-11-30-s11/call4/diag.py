"""Build gemm_wgmma configs for 4096^3 (plus extra -D defines), dump their sm_90a PTX, run ptxas -v on it
where a ptxas exists, and time each against the default plan's result.

Run from the repository root with ../register-a-trial.patch applied (the AREG configs and the
AREG_NOPREFETCH define exist only there): TUNECL_DEVICE=nvidia python diag.py OUTDIR
"""
import glob, json, os, shutil, subprocess, sys, time
import numpy as np
import pyopencl as cl
from tunecl import runtime
from tunecl.kernels.gemm_wgmma import GemmWgmmaTF32, GemmWgmmaF16
from tunecl.problems import GemmProblem

OUT = sys.argv[1]
dev = runtime.select_device()
ptxas = shutil.which("ptxas") or next(iter(sorted(glob.glob("/**/bin/ptxas", recursive=True))), None)
print("ptxas:", ptxas, flush=True)
T = dict(GM=8, VW=4, SWIZZLE=64, WARPGROUPS=2, MWG=128, INFLIGHT=0)
H = dict(GM=8, VW=8, SWIZZLE=64, WARPGROUPS=2, MWG=128, INFLIGHT=0)
CASES = [
    ("tf32-default", "float32", {}, []),
    ("tf32-smem-pretrans0", "float32", dict(T, NWG=128, KWG=16, STAGES=3, PRETRANS=0, AREG=0), []),
    ("tf32-areg-128x128-s6", "float32", dict(T, NWG=128, KWG=16, STAGES=6, PRETRANS=0, AREG=1), []),
    ("tf32-areg-128x128-s6-noprefetch", "float32", dict(T, NWG=128, KWG=16, STAGES=6, PRETRANS=0, AREG=1), ["-DAREG_NOPREFETCH=1"]),
    ("tf32-areg-128x256-s3", "float32", dict(T, NWG=256, KWG=16, STAGES=3, PRETRANS=0, AREG=1), []),
    ("tf32-areg-128x256-s3-noprefetch", "float32", dict(T, NWG=256, KWG=16, STAGES=3, PRETRANS=0, AREG=1), ["-DAREG_NOPREFETCH=1"]),
    ("f16-default", "float16", {}, []),
    ("f16-areg-128x256-s3", "float16", dict(H, NWG=256, KWG=32, STAGES=3, AREG=1), []),
    ("f16-areg-128x256-s3-noprefetch", "float16", dict(H, NWG=256, KWG=32, STAGES=3, AREG=1), ["-DAREG_NOPREFETCH=1"]),
]
ref = {}
rows = []
for name, dtype, cfg, extra in CASES:
    alg = GemmWgmmaF16() if dtype == "float16" else GemmWgmmaTF32()
    p = GemmProblem(4096, 4096, 4096, dtype=dtype)
    cfg = cfg or alg.default(p, dev)
    plan = alg.build(p, dev, cfg)
    inner = getattr(plan, "inner", plan)
    base_options = inner._options
    inner._options = lambda v, base=base_options, extra=extra: base(v) + extra
    inner._kernels.clear()
    variant = next(iter(inner._kernels), None)
    opts = inner._options((True, True, True))
    prog = cl.Program(dev.context, inner._source).build(options=opts)
    ptx = runtime.retarget_ptx(prog.binaries[0].decode("utf-8", "replace").rstrip("\x00"))
    path = os.path.join(OUT, name + ".ptx")
    open(path, "w").write(ptx)
    log = ""
    try:
        final = cl.Program(dev.context, [dev.cl_device], [ptx.encode() + b"\x00"]).build()
        log = final.get_build_info(dev.cl_device, cl.program_build_info.LOG)
    except cl.Error as e:
        log = "BUILD ERROR " + str(e)[:2000]
    if ptxas:
        r = subprocess.run([ptxas, "-arch=sm_90a", "-v", "--warn-on-spills", path, "-o", "/dev/null"],
                           capture_output=True, text=True)
        log += "\n[ptxas] " + (r.stdout + r.stderr)
    open(os.path.join(OUT, name + ".log"), "w").write(log)
    np_dtype = np.float16 if dtype == "float16" else np.float32
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (4096, 4096)).astype(np_dtype)
    b = rng.uniform(-1, 1, (4096, 4096)).astype(np_dtype)
    A, B, C = dev.upload(a), dev.upload(b), dev.upload(np.zeros((4096, 4096), np_dtype))
    for _ in range(3):
        ev = plan.run(A, B, C)
    ev[-1].wait()
    times = []
    for _ in range(15):
        ev = plan.run(A, B, C)
        ev[-1].wait()
        times.append((ev[-1].profile.end - ev[0].profile.start) * 1e-9)
    out = dev.download(C, (4096, 4096), np_dtype).astype(np.float64)
    if dtype not in ref:
        ref[dtype] = out
    diff = float(np.abs(out - ref[dtype]).max())
    t = float(np.median(times))
    row = dict(name=name, config=cfg, extra=extra, ms=t * 1e3, tflops=2 * 4096**3 / t / 1e12, maxdiff_vs_default=diff)
    rows.append(row)
    print(json.dumps(row), flush=True)
    print("  log:", " | ".join(l for l in log.splitlines() if l.strip())[:1500], flush=True)
json.dump(rows, open(os.path.join(OUT, "diag.json"), "w"), indent=1)
