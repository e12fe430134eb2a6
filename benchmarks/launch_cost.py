"""Host cost of the OpenCL calls every op makes, on one device: what a launch and an allocation cost.

On the H200 the backend's ops cost about three times more host time than on the development machine's
PoCL device, and a bare pyopencl launch measured 14.6 µs there. This splits a launch into its parts and
times the other per-op calls, each the median of ``--repeats`` rounds of ``--calls`` calls:

- ``set_args`` of a kernel with 1 to 256 arguments (distinct buffers and ints alternating; as many as the
  device's parameter size allows: the multi-tensor kernels of the optimizer steps take ~200), without
  enqueueing;
- ``enqueue`` of the same kernel with its arguments already set (``enqueue_nd_range_kernel``);
- ``call``: pyopencl's ``kernel(queue, ...)`` (sets every argument, then enqueues), what tunecl does;
- ``create_buffer`` of 4 KiB and 64 MiB (``clCreateBuffer``; the caching allocator avoids it after warm-up);
- ``empty``: ``torch.empty`` of 16 floats on the opencl device (tunecl's allocator, DLPack, torch);
- ``wait``: ``finish`` on an idle queue;
- ``enqueue variants``: the same launch (arguments set) through pyopencl on the profiling queue the
  backend uses and on a queue without profiling, and straight through ``clEnqueueNDRangeKernel`` (ctypes,
  no event asked for) on both, at 1 and at 2^20 work-items: which part of a launch is the driver's own;
- ``launch thread`` (``--overlap``): ops of ``--work`` µs of Python each followed by one launch (arguments
  set), the launch made inline (pyopencl, or ``clEnqueueNDRangeKernel`` through ctypes) or handed to a
  thread that makes it through ctypes (which releases the GIL during the driver's call), at several
  ``sys.setswitchinterval`` values: whether a launch thread hides the driver's time from the op's Python.
- ``pointer table`` (``--pointer-table``): a multi-tensor launch over 8 to 128 buffers, each passed as a
  pointer argument (as the optimizer and foreach kernels do) or read from a table of the buffers' device
  addresses in one buffer argument (each address written once by a kernel that stores its argument's
  address). Says whether the device computes the table version right (OpenCL does not promise that a
  buffer's address outlives the launch that saw it) and what each launch costs.

    python benchmarks/launch_cost.py                   # default device
    TUNECL_DEVICE=nvidia python benchmarks/launch_cost.py
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
import ctypes
import ctypes.util
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyopencl as cl

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from tunecl import runtime


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


def _opencl_library() -> ctypes.CDLL | None:
    """The OpenCL loader pyopencl loaded (its wheel bundles one), found in this process's mappings."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libOpenCL" in line}
    except OSError:
        paths = set()
    name = next(iter(sorted(paths)), None) or ctypes.util.find_library("OpenCL")
    if name is None:
        return None
    library = ctypes.CDLL(name)
    library.clEnqueueNDRangeKernel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p,
                                               ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p,
                                               ctypes.c_void_p]
    library.clEnqueueNDRangeKernel.restype = ctypes.c_int
    return library


def enqueue_variants(device, calls: int, repeats: int) -> None:
    """Print the cost of one enqueue by queue kind and by path (pyopencl with its event, or raw)."""
    library = _opencl_library()
    plain = cl.CommandQueue(device.context, device.cl_device)
    kernel = cl.Kernel(device.build(_source(4)), "k4")
    kernel.set_scalar_arg_dtypes([None, np.int32, None, np.int32])
    buffer = device.alloc(4096)
    kernel.set_args(buffer, 1, buffer, 3)
    print("enqueue variants, µs per launch (arguments already set)")
    print(f"{'work-items':>10}  {'queue':>9}  {'pyopencl':>9}  {'raw, no event':>13}")
    for items, local in ((1, None), (1 << 20, 256)):
        size = (ctypes.c_size_t * 1)(items)
        local_size = None if local is None else (ctypes.c_size_t * 1)(local)
        for label, queue in (("profiling", device.queue), ("plain", plain)):
            def wrapped(queue=queue, items=items, local=local):
                cl.enqueue_nd_range_kernel(queue, kernel, (items,), None if local is None else (local,))

            def raw(queue=queue.int_ptr, kernel=kernel.int_ptr, size=size, local_size=local_size):
                error = library.clEnqueueNDRangeKernel(queue, kernel, 1, None, size, local_size, 0, None, None)
                if error:
                    raise RuntimeError(f"clEnqueueNDRangeKernel returned {error}")

            row = [_median_us(wrapped, calls, repeats)]
            queue.finish()
            if library is not None:
                row.append(_median_us(raw, calls, repeats))
                queue.finish()
            raw_text = f"{row[1]:>13.2f}" if len(row) > 1 else f"{'(no loader)':>13}"
            print(f"{items:>10}  {label:>9}  {row[0]:>9.2f}  {raw_text}")


def _busy(us: float) -> Callable[[], int]:
    """A pure-Python function taking about ``us`` µs here (calibrated), standing in for an op's dispatch."""
    n = 64
    while True:
        start = time.perf_counter()
        for _ in range(200):
            sum(range(n))
        took = (time.perf_counter() - start) / 200 * 1e6
        if took >= us or n > 1 << 22:
            break
        n = max(n + 1, int(n * us / max(took, 0.01)))
    return lambda n=n: sum(range(n))


def overlap(device, calls: int, repeats: int, work_us: float) -> None:
    """Print µs per op (Python work then one launch) with the launch inline or on a launch thread."""
    import queue as queues
    import threading

    library = _opencl_library()
    if library is None:
        print("launch thread: no OpenCL loader found for ctypes")
        return
    plain = cl.CommandQueue(device.context, device.cl_device)
    kernel = cl.Kernel(device.build(_source(4)), "k4")
    kernel.set_scalar_arg_dtypes([None, np.int32, None, np.int32])
    buffer = device.alloc(4096)
    kernel.set_args(buffer, 1, buffer, 3)
    size = (ctypes.c_size_t * 1)(1)
    enqueue = library.clEnqueueNDRangeKernel
    q_ptr, k_ptr = plain.int_ptr, kernel.int_ptr
    work = _busy(work_us)
    alone = _median_us(work, calls, repeats)

    def raw() -> None:
        if enqueue(q_ptr, k_ptr, 1, None, size, None, 0, None, None):
            raise RuntimeError("clEnqueueNDRangeKernel failed")

    def inline_pyopencl() -> None:
        work()
        cl.enqueue_nd_range_kernel(plain, kernel, (1,), None)

    def inline_raw() -> None:
        work()
        raw()

    print(f"launch thread: µs per op of {alone:.2f} µs Python work and one launch (plain queue, 1 work-item; "
          f"end to end, the queue finished)")
    rows = [("inline, pyopencl", None, inline_pyopencl), ("inline, ctypes", None, inline_raw)]
    default_interval = sys.getswitchinterval()
    for interval in (default_interval, 2e-4, 5e-5, 1e-5):
        rows.append((f"launch thread, switch {interval * 1e6:.0f} µs", interval, None))
    for label, interval, function in rows:
        if function is not None:
            def run() -> None:
                for _ in range(calls):
                    function()
                plain.finish()
        else:
            def run(interval=interval) -> None:
                handoff: queues.SimpleQueue = queues.SimpleQueue()

                def launcher() -> None:
                    get = handoff.get
                    while get() is not None:
                        raw()

                sys.setswitchinterval(interval)
                thread = threading.Thread(target=launcher, daemon=True)
                thread.start()
                try:
                    put = handoff.put
                    for _ in range(calls):
                        work()
                        put(1)
                    put(None)
                    thread.join()
                finally:
                    sys.setswitchinterval(default_interval)
                plain.finish()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            times.append((time.perf_counter() - start) / calls * 1e6)
        print(f"  {label:<32} {statistics.median(times):8.2f}  (spread {min(times):.2f}-{max(times):.2f})")


_TABLE_SOURCE = """
__kernel void address_of(__global float *p, __global ulong *table, const int k) { table[k] = (ulong)p; }
__kernel void by_table(__global const ulong *table, const int count) {
  const int k = (int)get_global_id(1);
  if (k < count && get_global_id(0) == 0) ((__global float *)table[k])[0] += 1.0f;
}
"""


def _by_arguments_source(count: int) -> str:
    params = ", ".join(f"__global float *p{k}" for k in range(count))
    cases = " ".join(f"case {k}: p = p{k}; break;" for k in range(count))
    return (f"__kernel void by_arguments{count}({params}) {{ __global float *p = 0; "
            f"switch ((int)get_global_id(1)) {{ {cases} }} if (get_global_id(0) == 0) p[0] += 1.0f; }}")


def pointer_table(device, calls: int, repeats: int) -> None:
    """Print whether launches reading buffers through a table of device addresses compute right, and µs per
    launch next to the same launch with a pointer argument per buffer."""
    queue = device.queue
    room = int(device.cl_device.max_parameter_size)
    program = device.build(_TABLE_SOURCE)
    address_of, by_table = cl.Kernel(program, "address_of"), cl.Kernel(program, "by_table")
    print("pointer table: µs per launch (arguments set) over N buffers, by pointer arguments or by a table")
    print(f"{'buffers':>8}  {'arguments':>10}  {'table':>8}  table right")
    for count in (8, 32, 64, 128):
        buffers = [device.alloc(4096) for _ in range(count)]
        for b in buffers:
            cl.enqueue_fill_buffer(queue, b, np.float32(0), 0, 4096)
        table = device.alloc(8 * count)
        for k, b in enumerate(buffers):
            address_of(queue, (1,), None, b, table, np.int32(k))
        by_table.set_args(table, np.int32(count))
        cl.enqueue_nd_range_kernel(queue, by_table, (64, count), (64, 1))
        values = np.empty(1, np.float32)
        right = True
        for b in buffers:
            cl.enqueue_copy(queue, values, b)
            right &= bool(values[0] == 1.0)
        table_us = _median_us(lambda: cl.enqueue_nd_range_kernel(queue, by_table, (64, count), (64, 1)),
                              calls, repeats)
        queue.finish()
        if count * 8 <= room:
            by_arguments = cl.Kernel(device.build(_by_arguments_source(count)), f"by_arguments{count}")
            by_arguments.set_args(*buffers)
            arguments_us = _median_us(lambda k=by_arguments: cl.enqueue_nd_range_kernel(queue, k, (64, count), (64, 1)),
                                      calls, repeats)
            queue.finish()
            arguments_text = f"{arguments_us:>10.2f}"
        else:
            arguments_text = f"{'(too many)':>10}"
        print(f"{count:>8}  {arguments_text}  {table_us:>8.2f}  {'yes' if right else 'NO'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="device selector (default: TUNECL_DEVICE or 0)")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--overlap", action="store_true",
                        help="only the launch-thread comparison (ops of --work µs of Python and one launch)")
    parser.add_argument("--work", type=float, nargs="+", default=[0.0, 15.0],
                        help="µs of Python work per op for --overlap (default: 0 and 15)")
    parser.add_argument("--pointer-table", action="store_true",
                        help="only the pointer-table comparison (buffers by argument or by a table of addresses)")
    args = parser.parse_args(argv)
    device = runtime.select_device(args.device)
    if args.pointer_table:
        print(f"device: {device.name} [{device.entry.platform}] | median of {args.repeats} rounds of {args.calls} calls")
        pointer_table(device, args.calls, args.repeats)
        return 0
    if args.overlap:
        print(f"device: {device.name} [{device.entry.platform}] | {args.calls} ops per round, median of "
              f"{args.repeats} rounds")
        for work_us in args.work:
            overlap(device, args.calls, args.repeats, work_us)
        return 0
    queue = device.queue
    calls, repeats = args.calls, args.repeats
    print(f"device: {device.name} [{device.entry.platform}] | median of {repeats} rounds of {calls} calls, µs")
    print(f"{'arguments':>9}  {'set_args':>9}  {'enqueue':>9}  {'call':>9}")
    buffers = [device.alloc(4096) for _ in range(128)]   # a distinct buffer per pointer argument
    room = int(device.cl_device.max_parameter_size)
    for count in [c for c in (1, 4, 16, 32, 64, 128, 256) if c * 8 <= room]:
        kernel = cl.Kernel(device.build(_source(count)), f"k{count}")
        kernel.set_scalar_arg_dtypes([None if i % 2 == 0 else np.int32 for i in range(count)])
        values = [buffers[i // 2] if i % 2 == 0 else i for i in range(count)]
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
    enqueue_variants(device, calls, repeats)
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
