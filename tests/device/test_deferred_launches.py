"""Device.defer: small launches that wait on the host and are enqueued together (TUNECL_LAUNCH_BATCH),
without ever changing the order of anything on the queue. The backend's elementwise ops go this way on
PoCL by default, so every test in tests/torch runs with it too; these tests pin down the mechanism."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest

from tunecl import config, runtime

SOURCE = """
__kernel void axpb(__global float* x, const float a, const float b) {
  const int i = get_global_id(0);
  x[i] = a * x[i] + b;
}
"""


@pytest.fixture
def batched(monkeypatch):
    """A Device of its own (select_device's is shared by the process) with a batch of 4."""
    monkeypatch.setenv("TUNECL_LAUNCH_BATCH", "4")
    device = runtime.Device(runtime.resolve())
    assert device.launch_batch == 4
    return device


def _kernel(device):
    kernel = device.kernel(device.build(SOURCE), "axpb", [None, np.float32, np.float32])
    return kernel


def test_deferred_launches_wait_then_run_in_order(batched):
    device = batched
    kernel = _kernel(device)
    x = np.arange(16, dtype=np.float32)
    buf = device.upload(x)
    expected = x.copy()
    for step in range(3):  # fewer than the batch: nothing enqueued yet
        device.defer(kernel, (16,), None, [buf, np.float32(2), np.float32(step)])
        expected = 2 * expected + step
    assert len(device._deferred) == 3
    # a read goes through the queue: the three launches are enqueued first, in order (x -> 2x + s is
    # not commutative across steps, so any reordering changes the result)
    np.testing.assert_array_equal(device.download(buf, (16,)), expected)
    assert not device._deferred


def test_the_batch_is_enqueued_when_full(batched):
    device = batched
    kernel = _kernel(device)
    buf = device.upload(np.ones(16, np.float32))
    for _ in range(4):
        device.defer(kernel, (16,), None, [buf, np.float32(1), np.float32(1)])
    assert not device._deferred  # the fourth filled the batch
    device._queue.finish()  # the raw queue: no flush involved
    np.testing.assert_array_equal(device.download(buf, (16,)), np.full(16, 5, np.float32))


def test_direct_enqueues_come_after_the_deferred_ones(batched):
    device = batched
    kernel = _kernel(device)
    src = device.upload(np.zeros(16, np.float32))
    device.defer(kernel, (16,), None, [src, np.float32(1), np.float32(7)])  # src = 7
    dst = device.upload(np.zeros(16, np.float32))
    cl.enqueue_copy(device.queue, dst, src)  # must copy the 7s, not the zeros
    np.testing.assert_array_equal(device.download(dst, (16,)), np.full(16, 7, np.float32))


def test_buffers_stay_alive_while_their_launch_waits(batched):
    device = batched
    kernel = _kernel(device)
    out = device.upload(np.zeros(16, np.float32))
    device.defer(kernel, (16,), None, [device.upload(np.full(16, 3, np.float32)), np.float32(1), np.float32(1)])
    device.defer(kernel, (16,), None, [out, np.float32(0), np.float32(2)])
    device.synchronize()  # the first buffer has no other reference: the waiting launch kept it
    np.testing.assert_array_equal(device.download(out, (16,)), np.full(16, 2, np.float32))


def test_batch_of_one_or_zero_enqueues_at_once(monkeypatch):
    monkeypatch.setenv("TUNECL_LAUNCH_BATCH", "0")
    device = runtime.Device(runtime.resolve())
    kernel = _kernel(device)
    buf = device.upload(np.zeros(16, np.float32))
    device.defer(kernel, (16,), None, [buf, np.float32(1), np.float32(1)])
    assert not device._deferred


SQUARE = """
__kernel void square_axpb(__global float* x, const float a, const float b) {
  const int i = get_global_id(0);
  const float v = a * x[i] + b;
  x[i] = v * v;
}
"""


@pytest.mark.parametrize("batch", ["0", "4"])
def test_a_held_launch_is_replaced_only_while_it_is_the_last_one_waiting(batch, monkeypatch):
    """Device.hold defers one launch even on an unbatched device; replace_held swaps in its fused kernel
    (same grid and arguments) until the queue is used or another launch is deferred after it."""
    monkeypatch.setenv("TUNECL_LAUNCH_BATCH", batch)
    device = runtime.Device(runtime.resolve())
    kernel = _kernel(device)
    fused = device.kernel(device.build(SQUARE), "square_axpb", [None, np.float32, np.float32])
    buf = device.upload(np.full(16, 2, np.float32))
    args = [buf, np.float32(1), np.float32(1)]

    device.hold(kernel, (16,), None, list(args), "tag", lambda op: fused)
    assert not device.replace_held("another tag")
    assert device.replace_held("tag")            # 2 -> (2 + 1)^2
    assert not device.replace_held("tag")        # once
    np.testing.assert_array_equal(device.download(buf, (16,)), np.full(16, 9, np.float32))

    device.hold(kernel, (16,), None, list(args), "tag", lambda op: fused)
    device.synchronize()                         # the queue was used: enqueued as it was
    assert not device.replace_held("tag")
    np.testing.assert_array_equal(device.download(buf, (16,)), np.full(16, 10, np.float32))

    device.hold(kernel, (16,), None, list(args), "tag", lambda op: fused)
    device.defer(kernel, (16,), None, list(args))   # another launch after it (batched: still waiting)
    assert not device.replace_held("tag")
    np.testing.assert_array_equal(device.download(buf, (16,)), np.full(16, 12, np.float32))

    # a held launch without a fused kernel for the op asked for stays as it is, and may still take another
    device.hold(kernel, (16,), None, list(args), "tag", lambda op: fused if op == "relu" else None)
    assert not device.replace_held("tag", "relu6")
    assert device.replace_held("tag", "relu")
    np.testing.assert_array_equal(device.download(buf, (16,)), np.full(16, 169, np.float32))


@pytest.mark.parametrize(("variable", "field", "auto", "number", "bad"), [
    ("TUNECL_LAUNCH_BATCH", "launch_batch", "AUTO", 16, ("-1", "many")),
    ("TUNECL_FLUSH_EVERY", "flush_every", "auto", 8, ("-2", "often")),
])
def test_count_settings(variable, field, auto, number, bad):
    """Unset or auto: None (the device decides); a count ≥ 0; anything else names the variable."""
    assert getattr(config.Config.from_env({}), field) is None
    assert getattr(config.Config.from_env({variable: auto}), field) is None
    assert getattr(config.Config.from_env({variable: str(number)}), field) == number
    for value in bad:
        with pytest.raises(ValueError, match=variable):
            config.Config.from_env({variable: value})


def test_auto_batches_on_cpu_devices_only(device):
    expected = runtime.AUTO_LAUNCH_BATCH if device.fingerprint.device_type == "cpu" else 0
    if config.get().launch_batch is None:
        assert device.launch_batch == expected


def test_the_queue_is_flushed_every_n_uses(monkeypatch):
    """With TUNECL_FLUSH_EVERY=3 every third use of Device.queue submits the commands (clFlush) first;
    results and order are unchanged."""
    monkeypatch.setenv("TUNECL_FLUSH_EVERY", "3")
    monkeypatch.setenv("TUNECL_LAUNCH_BATCH", "0")
    device = runtime.Device(runtime.resolve())
    assert device.flush_every == 3
    flushes = []

    class CountingQueue:  # the real queue, with its flushes counted
        def __init__(self, queue):
            self.queue = queue

        def flush(self):
            flushes.append(1)
            return self.queue.flush()

        def __getattr__(self, name):
            return getattr(self.queue, name)

    real = device._queue
    device._queue = CountingQueue(real)
    uses = [device.queue for _ in range(7)]
    assert len(flushes) == 2 and all(q is device._queue for q in uses)
    device._queue = real
    kernel = _kernel(device)
    buf = device.upload(np.zeros(16, np.float32))
    for _ in range(10):
        kernel(device.queue, (16,), None, buf, np.float32(2), np.float32(1))  # x = 2x + 1
    np.testing.assert_array_equal(device.download(buf, (16,)), np.full(16, 2 ** 10 - 1, np.float32))


def test_the_queue_submits_every_flush_every_uses(monkeypatch):
    """The queue submits (clFlush) once every TUNECL_FLUSH_EVERY uses, whatever ran before (a synchronize,
    a read)."""
    monkeypatch.setenv("TUNECL_FLUSH_EVERY", "16")
    monkeypatch.setenv("TUNECL_LAUNCH_BATCH", "0")
    device = runtime.Device(runtime.resolve())
    flushes = []

    class CountingQueue:  # the real queue, with the use at each flush noted
        def __init__(self, queue):
            self.queue = queue

        def flush(self):
            flushes.append(uses)
            return self.queue.flush()

        def __getattr__(self, name):
            return getattr(self.queue, name)

    real, counting = device._queue, CountingQueue(device._queue)
    buf = device.upload(np.arange(4, dtype=np.float32))
    device.synchronize()
    device.copyout(np.empty(4, np.float32), buf)
    device._queue = counting
    for uses in range(1, 41):
        device.queue   # noqa: B018
    device._queue = real
    assert len(flushes) >= 2 and all(b - a == 16 for a, b in zip(flushes, flushes[1:]))


def test_auto_flushes_on_non_cpu_devices_only(device):
    expected = 0 if device.fingerprint.device_type == "cpu" else runtime.AUTO_FLUSH_EVERY
    if config.get().flush_every is None:
        assert device.flush_every == expected


@pytest.mark.parametrize("batch", ["0", "4"])
def test_held_launches_do_not_pile_up(batch, monkeypatch):
    """A run of held launches (adds, each waiting for a relu that does not come) is sent on as defer would
    send it: one waits at a time unbatched, at most a batch batched."""
    monkeypatch.setenv("TUNECL_LAUNCH_BATCH", batch)
    device = runtime.Device(runtime.resolve())
    kernel = _kernel(device)
    buf = device.upload(np.zeros(16, np.float32))
    for step in range(10):
        device.hold(kernel, (16,), None, [buf, np.float32(1), np.float32(1)], ("tag", step), lambda op: kernel)
        assert len(device._deferred) <= max(1, device.launch_batch)
    np.testing.assert_array_equal(device.download(buf, (16,)), np.full(16, 10, np.float32))
