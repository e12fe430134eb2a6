"""Buffers' device addresses (tunecl.runtime.addresses) and optim.cl's kernels that take them by value."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest

from tunecl import config
from tunecl.kernels.ops.optim import Optim
from tunecl.runtime import addresses


def _buffer(device, floats: int) -> cl.Buffer:
    return cl.Buffer(device.context, cl.mem_flags.READ_WRITE, 4 * floats)


def test_the_probe_finds_the_device_keeps_its_buffers_at_their_addresses(device):
    # (PoCL's CPU device: buffers are host memory at fixed addresses)
    assert addresses.reason_unusable(device) == ""
    assert addresses.usable(device)


def test_turned_off_by_the_environment(device):
    with config.override(addresses="off"):
        assert addresses.reason_unusable(device) == "TUNECL_ADDRESSES is off"
        assert not addresses.usable(device)


@pytest.mark.parametrize("value", ["sometimes", "1"])
def test_a_bad_setting_is_refused_by_name(value):
    with pytest.raises(ValueError, match="TUNECL_ADDRESSES must be one of auto, off, not"):
        config.Config.from_env({"TUNECL_ADDRESSES": value})
    assert config.Config.from_env({"TUNECL_ADDRESSES": "OFF"}).addresses == "off"
    assert config.Config.from_env({}).addresses == "auto"


def test_addresses_are_learned_once_and_kept_per_buffer(device, monkeypatch):
    a, b = _buffer(device, 8), _buffer(device, 8)
    found = addresses.addresses(device, [a, None, b, a])
    assert found[1] == 0 and found[0] == found[3] and len({found[0], found[2]}) == 2 and 0 not in (found[0], found[2])
    learned = []
    monkeypatch.setattr(addresses, "_learn", lambda device, buffers: learned.append(buffers))
    assert addresses.addresses(device, [b, a]) == [found[2], found[0]]
    assert learned == []   # known: no launch, no wait
    c = _buffer(device, 8)
    with pytest.raises(AttributeError):   # (the stub learned nothing)
        addresses.addresses(device, [a, c])
    assert learned == [[c]]   # only the unknown one is learned


def test_a_step_by_address_reaches_offsets_into_buffers(device, rng):
    """adam_step's ADDRESSES variant against its pointer variant, tensors at offsets into shared buffers."""
    optim = Optim(device)
    if not optim.by_address():
        pytest.skip("the device does not let kernels reach buffers by address")
    numels = [5, 1, 17, 3, 9, 2, 11, 4, 6, 13]   # more tensors than a launch's slots
    offsets = [0, 7, 3, 0, 20, 1, 0, 2, 5, 0]
    columns = 4   # param, grad, exp_avg, exp_avg_sq (vmax absent); step counts in a column of their own
    host = [[rng.standard_normal(n + o).astype(np.float32) for n, o in zip(numels, offsets)] for _ in range(columns)]
    for column in host[3]:
        np.abs(column, out=column)
    steps = np.array([3.0], np.float32)

    def run(by_address: bool) -> list[list[np.ndarray]]:
        chunks = optim.adam_chunks(numels, lr=0.01, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8,
                                   amsgrad=False, maximize=False, adamw=False, tensors=(False, False, False))
        if not by_address:
            chunks._by_address = None   # (the pointer variant)
        queue = device.queue
        bufs = [[cl.Buffer(device.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=a)
                 for a in column] for column in host]
        step = cl.Buffer(device.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=steps)
        for column in range(columns):
            chunks.set_offsets(column, offsets)
        chunks.set_offsets(4, [0] * len(numels))
        chunks.set_offsets(5, [0] * len(numels))
        by_column = [*bufs, [None] * len(numels), [step] * len(numels)]
        assert chunks.prebuild(by_column)
        assert (chunks.address_kernel is not None) == by_address
        for _ in range(2):
            chunks.enqueue(lambda: queue)
        out = []
        for column in bufs:
            out.append([])
            for buffer, a in zip(column, host[0]):
                got = np.empty_like(a)
                cl.enqueue_copy(queue, got, buffer)
                out[-1].append(got)
        return out

    pointer, by_address = run(False), run(True)
    for column_p, column_a in zip(pointer, by_address):
        for p, a in zip(column_p, column_a):
            np.testing.assert_array_equal(p, a)
    changed = [not np.array_equal(p, h) for p, h in zip(pointer[0], host[0])]
    assert all(changed)   # every parameter moved (the steps ran)
