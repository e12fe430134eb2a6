"""Why does the wgmma probe not build on this driver, and does PTX-level loading (sm_90a) work?"""
import re, sys, traceback, warnings
import numpy as np
import pyopencl as cl
from importlib import resources
warnings.simplefilter("ignore")
from tunecl import runtime

dev = runtime.select_device("nvidia")
cld = dev.cl_device if hasattr(dev, "cl_device") else dev.device
print("device", cld.name, cld.driver_version, cld.version)
ctx = cl.Context([cld]); q = cl.CommandQueue(ctx, cld)
src = resources.files("tunecl").joinpath("capabilities.cl").read_text()

def try_build(label, text, opts):
    try:
        p = cl.Program(ctx, text).build(options=opts)
        print(f"== {label}: built"); return p
    except cl.Error as e:
        print(f"== {label}: FAILED\n{str(e)[:6000]}"); return None

# 1. the real error
try_build("probe as is", src, ["-DPROBE_WGMMA"])
# 2. ptx header of a plain program
p = try_build("mma probe", src, ["-DPROBE_MMA_TF32"])
if p is not None:
    ptx = p.binaries[0].decode(errors="replace")
    print("\n".join(l for l in ptx.splitlines()[:40] if l.startswith(".") or "//" in l[:3]))
# 3. arch options
for opt in (["-cl-nv-arch", "sm_90a"], ["-cl-nv-arch=sm_90a"], ["-cl-nv-verbose"]):
    try_build(f"probe with {opt}", src, ["-DPROBE_WGMMA"] + opt)
# 4. comment trick: hide wgmma from the source compiler, restore it in the PTX, load the PTX as binary
hidden = src.replace('"wgmma.', '"//@wgmma.').replace("asm volatile(\"//@wgmma", "asm volatile(\"//@wgmma")
p = try_build("probe with wgmma hidden", hidden, ["-DPROBE_WGMMA"])
if p is not None:
    ptx = p.binaries[0].decode(errors="replace").rstrip("\x00")
    print("hidden lines:", ptx.count("//@wgmma"))
    ver = re.search(r"\.version (\d+)\.(\d+)", ptx); tgt = re.search(r"\.target (\S+)", ptx)
    print("version", ver.group(0) if ver else None, "target", tgt.group(0) if tgt else None)
    for version in (None, "8.0", "8.3"):
        patched = ptx.replace("//@wgmma", "wgmma")
        patched = re.sub(r"\.target sm_90\b", ".target sm_90a", patched)
        if version:
            patched = re.sub(r"\.version \d+\.\d+", f".version {version}", patched)
        try:
            prog = cl.Program(ctx, [cld], [patched.encode() + b"\x00"]).build()
            print(f"== PTX binary route (version {version}): built")
        except Exception as e:
            print(f"== PTX binary route (version {version}): FAILED {str(e)[:3000]}"); continue
        bad = 0
        for case, (f16, sw, a_mn, b_mn) in enumerate(runtime.WGMMA_PROBE_CASES):
            a, b = runtime._wgmma_probe_data(bool(f16), case)
            out = np.zeros((64, 64), np.float32); info = np.full(1, 7, np.uint32)
            mf = cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR
            ab = cl.Buffer(ctx, mf, hostbuf=np.ascontiguousarray(a)); bb = cl.Buffer(ctx, mf, hostbuf=np.ascontiguousarray(b))
            ob = cl.Buffer(ctx, mf, hostbuf=out); ib = cl.Buffer(ctx, mf, hostbuf=info)
            prog.probe_wgmma(q, (128,), (128,), ab, bb, ob, ib, np.int32(f16), np.int32(sw), np.int32(a_mn), np.int32(b_mn)).wait()
            cl.enqueue_copy(q, out, ob); cl.enqueue_copy(q, info, ib); q.finish()
            ref = a.astype(np.float64) @ b.astype(np.float64).T
            err = np.abs(out - ref).max()
            print(f"case {case} f16={f16} sw={sw} a_mn={a_mn} b_mn={b_mn} align={info[0]} maxerr={err}")
            bad += err > 1e-6
        print("PTX route wrong cases:", bad)
        break
