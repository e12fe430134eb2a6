"""Whether a device's kernels may finish their own split reductions (``gemm/split_finish.cl``).

A kernel whose reduction is split over work-groups can have the last work-group of each output tile add
the parts (one launch) instead of a second launch. That hands the parts from work-group to work-group
through a global fence and an atomic counter, which OpenCL 1.2 does not promise to order on every device.
So a device finishes splits only where a probe finds that it does: once per device, a launch of many
work-groups per tile each storing its part and counting itself, twice over a workspace filled with other
values, whose last work-groups must read every part as stored (exact integer sums) and leave every
counter zero. Elsewhere, and with a family's ``FINISH_SPLITS`` False, the second launch adds the parts.
While :func:`tunecl.tools.launch_stub.stub_launches` keeps launches from the device (a benchmark of the
host's cost), there is nothing to probe: devices finish splits, as one that passes the probe does.
"""

from __future__ import annotations

import sys
import threading
import warnings
import weakref
from typing import Any

import numpy as np
import pyopencl as cl

from tunecl.kernels.base import read_source

PARTS = 8            # work-groups per tile in the probe
TILES = 2048         # tiles of the probe (enough work-groups to fill a large GPU several times over)
ITEMS = 64           # work-items (and outputs) per tile


PROBE = True         # False: every device finishes splits, unprobed (a simulator's runs of the kernels)
_verdicts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # device -> "" (finishes) or why not
_lock = threading.Lock()


def finishes(device: Any) -> bool:
    """Whether kernels on ``device`` may finish their split reductions themselves (see the module docstring);
    a device that fails the probe gets one warning naming why."""
    verdict = _verdicts.get(device)
    if verdict is None:
        stub = sys.modules.get("tunecl.tools.launch_stub")
        if not PROBE or (stub is not None and stub.active):
            return True
        with _lock:
            verdict = _verdicts.get(device)
            if verdict is None:
                verdict = _verdicts[device] = _probe(device)
                if verdict:
                    warnings.warn(f"{device.name}: split reductions take a second launch: {verdict}",
                                  RuntimeWarning, stacklevel=2)
    return not verdict


def _probe(device: Any) -> str:
    """"" where the hand-off held in two rounds, else what went wrong."""
    try:
        program = device.build(read_source(__package__ + ".gemm", "split_probe.cl"),
                               [f"-DITEMS={ITEMS}", f"-DPARTS={PARTS}"])
        kernel = cl.Kernel(program, "split_probe")
        queue = device.queue
        ws = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, 4 * PARTS * TILES * ITEMS)
        out = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, 4 * TILES * ITEMS)
        counters = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, 4 * TILES)
        cl.enqueue_fill_buffer(queue, ws, np.float32(-1e6), 0, 4 * PARTS * TILES * ITEMS)
        cl.enqueue_fill_buffer(queue, counters, np.int32(0), 0, 4 * TILES)
        for round in (1, 3):
            cl.enqueue_fill_buffer(queue, out, np.float32(np.nan), 0, 4 * TILES * ITEMS)
            kernel.set_args(ws, out, counters, np.int32(round))
            cl.enqueue_nd_range_kernel(queue, kernel, (TILES * ITEMS, PARTS), (ITEMS, 1))
            got = np.empty(TILES * ITEMS, np.float32)
            cl.enqueue_copy(queue, got, out)   # (waits)
            want = round * PARTS * (PARTS + 1) / 2
            if not (got == want).all():
                wrong = int((got != want).sum())
                return (f"a probe's last work-groups read {wrong} of {got.size} parts' sums wrong "
                        f"(round {round}: {got[got != want][:3].tolist()} for {want})")
        left = np.empty(TILES, np.int32)
        cl.enqueue_copy(queue, left, counters)
        if left.any():
            return f"a probe left {int((left != 0).sum())} tile counters non-zero"
        return ""
    except cl.Error as error:
        return f"the probe could not run ({error})"
