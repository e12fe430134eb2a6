"""Host cost of the OpenCL calls every op makes, on one device: what a launch and an allocation cost.

On the H200 the backend's ops cost about three times more host time than on the development machine's
PoCL device, and a bare pyopencl launch measured 14.6 µs there. This splits a launch into its parts and
times the other per-op calls, each the median of ``--repeats`` rounds of ``--calls`` calls:

- ``set_args`` of a kernel with 1, 4, 16 and 32 arguments (buffers and ints), without enqueueing;
- ``enqueue`` of the same kernel with its arguments already set (``enqueue_nd_range_kernel``);
- ``call``: pyopencl's ``kernel(queue, ...)`` (sets every argument, then enqueues), what tunecl does;
- ``create_buffer`` of 4 KiB and 64 MiB (``clCreateBuffer``; the caching allocator avoids it after warm-up);
- ``empty``: ``torch.empty`` of 16 floats on the opencl device (tunecl's allocator, DLPack, torch);
- ``wait``: ``finish`` on an idle queue.

    python benchmarks/launch_cost.py                   # default device
    TUNECL_DEVICE=nvidia python benchmarks/launch_cost.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyopencl as cl

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from tunecl import runtime  # noqa: E402


def _source(count: int) -> str:
    """A kernel with ``count`` arguments: buffers and ints alternating, the first a buffer it writes."""
    params = ", ".join(f"__global float* b{i}" if i % 2 == 0 else f"const int n{i}" for i in range(count))
    return f"__kernel void k{count}({params}) {{ if (get_global_id(0) == 0) b0[0] += 1.0f; }}"


def _median_us(function, calls: int, repeats: int) -> float:
    rounds = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            function()
        rounds.append((time.perf_counter() - start) / calls)
    return statistics.median(rounds) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="device selector (default: TUNECL_DEVICE or 0)")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    device = runtime.select_device(args.device)
    queue = device.queue
    calls, repeats = args.calls, args.repeats
    buffer = device.alloc(4096)
    print(f"device: {device.name} [{device.entry.platform}] | median of {repeats} rounds of {calls} calls, µs")
    print(f"{'arguments':>9}  {'set_args':>9}  {'enqueue':>9}  {'call':>9}")
    for count in (1, 4, 16, 32):
        kernel = cl.Kernel(device.build(_source(count)), f"k{count}")
        kernel.set_scalar_arg_dtypes([None if i % 2 == 0 else np.int32 for i in range(count)])
        values = [buffer if i % 2 == 0 else i for i in range(count)]
        kernel(queue, (1,), None, *values)
        queue.finish()

        def set_args(kernel=kernel, values=values):
            kernel.set_args(*values)

        def enqueue(kernel=kernel):
            cl.enqueue_nd_range_kernel(queue, kernel, (1,), None)

        def call(kernel=kernel, values=values):
            kernel(queue, (1,), None, *values)

        row = []
        for function in (set_args, enqueue, call):
            row.append(_median_us(function, calls, repeats))
            queue.finish()
        print(f"{count:>9}  {row[0]:>9.2f}  {row[1]:>9.2f}  {row[2]:>9.2f}")
    small = _median_us(lambda: cl.Buffer(device.context, cl.mem_flags.READ_WRITE, 4096), calls // 10, repeats)
    large = _median_us(lambda: cl.Buffer(device.context, cl.mem_flags.READ_WRITE, 64 << 20), calls // 10,
                       repeats)
    wait = _median_us(queue.finish, calls, repeats)
    print(f"create_buffer 4 KiB {small:.2f}, 64 MiB {large:.2f}; finish on an idle queue {wait:.2f}")
    import torch

    import tunecl.backend  # noqa: F401

    for _ in range(100):
        torch.empty(16, device="opencl")
    empty = _median_us(lambda: torch.empty(16, device="opencl"), calls, repeats)
    print(f"torch.empty(16) on opencl {empty:.2f} (CPU torch: "
          f"{_median_us(lambda: torch.empty(16), calls, repeats):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
