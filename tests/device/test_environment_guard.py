"""tests/environment_guard.py: environment writes right after launches of kernels PoCL has not cached."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parents[1]
LAUNCH_THEN_WRITE = """
import os, sys
sys.path.insert(0, {tests!r})
import environment_guard
import numpy as np
import pyopencl as cl
from tunecl import runtime
environment_guard.install()
device = runtime.select_device()
buffer = device.upload(np.zeros(16, np.float32))
for k in range(24):   # each kernel new to the caches: its first launch links it
    program = device.build("__kernel void k(__global float* a) {{ a[get_global_id(0)] += %d.25f; }}" % k)
    cl.Kernel(program, "k")(device.queue, (16,), None, buffer)
    for j in range(200):   # new variables: the environment block grows while the link may run
        os.environ["TUNECL_TEST_GUARD_%d_%d" % (k, j)] = "x"
device.synchronize()
out = device.download(buffer, (16,))
print("sum", float(out[0]))
"""


def test_environment_writes_after_uncached_launches_keep_the_process_alive(tmp_path):
    """Without the guard this process dies on PoCL as a rule (the linker's spawn fails with EFAULT and PoCL
    aborts, or the process faults)."""
    env = {**os.environ, "POCL_CACHE_DIR": str(tmp_path / "pocl"), "TUNECL_CACHE_DIR": str(tmp_path / "kernels")}
    done = subprocess.run([sys.executable, "-c", LAUNCH_THEN_WRITE.format(tests=str(TESTS))], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == str(sum(k + 0.25 for k in range(24))), done.stdout
