"""KernelProfile: the device time of every kernel launch and copy in a block, by name."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest

from tunecl.profiling import KernelProfile

SOURCE = """
__kernel void scale(__global float* x, const float a) { x[get_global_id(0)] *= a; }
__kernel void shift(__global float* x, const float b) { x[get_global_id(0)] += b; }
"""


def test_profile_counts_every_launch_and_copy_by_name_and_leaves_results_alone(device):
    program = device.build(SOURCE)
    scale = device.kernel(program, "scale", [None, np.float32])
    shift = device.kernel(program, "shift", [None, np.float32])
    x = np.arange(4096, dtype=np.float32)
    buf = device.upload(x)
    original_call, original_copy = cl.Kernel.__call__, cl.enqueue_copy
    with KernelProfile() as profile:
        for _ in range(3):
            scale(device.queue, (4096,), None, buf, np.float32(2))
        shift(device.queue, (4096,), None, buf, np.float32(1))
        out = device.download(buf, x.shape)
        rows = {row.name: row for row in profile.summary()}
    assert cl.Kernel.__call__ is original_call and cl.enqueue_copy is original_copy   # swapped back
    np.testing.assert_array_equal(out, x * 8 + 1)
    assert {name: row.launches for name, row in rows.items()} == {"scale": 3, "shift": 1, "copy device→host": 1}
    assert all(row.seconds >= 0 for row in rows.values()) and rows["scale"].seconds > 0
    assert profile.commands == 5
    # outside the block nothing is recorded
    scale(device.queue, (4096,), None, buf, np.float32(2))
    assert profile.commands == 5


def test_only_one_profile_at_a_time_and_the_swap_is_undone_on_errors():
    original = cl.Kernel.__call__
    with pytest.raises(ZeroDivisionError), KernelProfile():
        with pytest.raises(RuntimeError, match="already active"), KernelProfile():
            pass
        raise ZeroDivisionError
    assert cl.Kernel.__call__ is original
    with KernelProfile():   # free again
        pass
