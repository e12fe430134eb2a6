"""Host↔device and device↔device copies: strided, broadcast, dtype-converting, non_blocking."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from opcheck import check_op


def test_strided_copies_in_every_direction(strict):
    x = torch.randn(5, 6, 7)
    views = {"transposed": lambda v: v.transpose(0, 2), "sliced": lambda v: v[1:4, ::2, 3:],
             "expanded": lambda v: v[:, :1].expand(5, 4, 7), "channels_last": lambda v: v[None].contiguous(
                 memory_format=torch.channels_last)}
    d = x.to("opencl")
    for name, view in views.items():
        expected = view(x)
        assert torch.equal(view(d).cpu(), expected), f"d2h {name}"
        assert torch.equal(expected.to("opencl").cpu(), expected), f"h2d {name}"
        assert view(d).contiguous().is_contiguous()
        assert torch.equal(view(d).contiguous().cpu(), expected.contiguous()), f"d2d {name}"
    dst = torch.zeros(6, 6, device="opencl")
    dst[::2].copy_(x[0, :, :3].t())                   # host -> strided device view
    dst[1::2].copy_(d[1, :, :3].t())                  # device view -> device view
    expected = torch.zeros(6, 6)
    expected[::2] = x[0, :, :3].t()
    expected[1::2] = x[1, :, :3].t()
    assert torch.equal(dst.cpu(), expected)
    host = torch.zeros(6, 3)
    host.copy_(d[0, :, :3].t().t()[:, :3])           # device view -> host
    assert torch.equal(host, x[0, :, :3].t().t()[:, :3])


def test_broadcasting_copy_(strict):
    dst = torch.empty(3, 4, device="opencl")
    dst.copy_(torch.arange(4.0))
    assert torch.equal(dst.cpu(), torch.arange(4.0).expand(3, 4))
    dst.copy_(torch.tensor(7.0, device="opencl"))
    assert torch.equal(dst.cpu(), torch.full((3, 4), 7.0))
    for src in (torch.ones(3, 5), torch.ones(2, 4, device="opencl")):
        with pytest.raises(RuntimeError, match="must match the size of the destination"):
            dst.copy_(src)


@pytest.mark.parametrize("src,dst", [(torch.float32, torch.float16), (torch.float16, torch.float32),
                                     (torch.float32, torch.int64), (torch.int64, torch.float32),
                                     (torch.float32, torch.bool), (torch.bool, torch.float32),
                                     (torch.int32, torch.uint8), (torch.float32, torch.bfloat16)])
def test_dtype_converting_copies(src, dst):
    x = (torch.randn(4, 5) * 100).to(src)
    check_op(lambda v: v.to(dst), x, grad=False, atol=0.5 if torch.bfloat16 in (src, dst) else 1e-5)
    check_op(lambda v: v.t().to(dst), x, grad=False, atol=0.5 if torch.bfloat16 in (src, dst) else 1e-5)
    assert torch.equal(x.to("opencl", dst).cpu(), x.to(dst))
    assert torch.equal(x.to("opencl").to("cpu", dst), x.to(dst))


def test_float64_host_data_converts_on_the_host():
    x = torch.randn(3, 3, dtype=torch.float64)
    dst = torch.empty(3, 3, device="opencl")
    dst.copy_(x)
    assert torch.equal(dst.cpu(), x.float())


def test_non_blocking_is_accepted(strict):
    x = torch.randn(8, 8)
    d = x.to("opencl", non_blocking=True)
    assert torch.equal(d.to("cpu", non_blocking=True), x)
    assert torch.equal(d.to("opencl", non_blocking=True).cpu(), x)


def test_pin_memory_and_dataloader(strict):
    x = torch.randn(6, 3)
    pinned = x.pin_memory()  # an unpinned copy while the backend is loaded (documented)
    assert torch.equal(pinned, x) and pinned.data_ptr() != x.data_ptr()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=4, pin_memory=True)
    batch = next(iter(loader))[0].to("opencl", non_blocking=True)
    assert torch.equal(batch.cpu(), x[:4])


def test_large_upload_takes_the_blocking_path(strict):
    x = torch.randn(5 << 20)  # 20 MiB > the staging limit
    assert torch.equal(x.to("opencl").cpu(), x)


def test_device_index_other_than_zero_is_refused():
    x = torch.randn(2)
    d = x.to("opencl")
    message = "opencl:1 does not exist"
    for make in (lambda: x.to("opencl:1"), lambda: torch.empty(2, device="opencl:1"), lambda: d.to("opencl:1"),
                 lambda: torch.opencl.set_device(1), lambda: torch.opencl.synchronize("opencl:1"),
                 lambda: torch.UntypedStorage(4, device="opencl:1"), lambda: torch.opencl.device(1)):
        with pytest.raises(RuntimeError, match=message):
            make()
    assert d.to("opencl:0").device == torch.device("opencl:0")


def test_large_uploads_go_through_the_pinned_buffer_back_to_back_and_as_it_grows(monkeypatch):
    from tunecl.backend import copies

    monkeypatch.setattr(copies, "PINNED_LIMIT", 1024)    # every upload below is "large"
    monkeypatch.setattr(copies, "PINNED_UPLOADS", True)  # (the GPU path, on any device)
    monkeypatch.setattr(copies, "_pinned", copies._PinnedStaging())
    monkeypatch.setattr(copies, "STAGING_CHUNK", 1000)   # several chunks, the last one partial
    hosts = [torch.randn(600), torch.randn(600), torch.randn(5000), torch.arange(7000, dtype=torch.int32)]
    devices = [h.to("opencl") for h in hosts]   # 2400 B, 2400 B (reusing the buffer), then two that grow it
    slice_dst = torch.zeros(900).to("opencl")
    slice_dst[100:700] = hosts[0]   # at an offset into the destination
    for h, d in zip(hosts, devices):
        assert torch.equal(d.cpu(), h)
    assert torch.equal(slice_dst.cpu()[100:700], hosts[0]) and not slice_dst.cpu()[:100].any()
    source = torch.randn(3000)
    before = source.clone()
    uploaded = source.to("opencl")
    source.add_(1)   # the host data may change right after the call returns, the write still pending
    assert torch.equal(uploaded.cpu(), before)


def test_a_large_upload_does_not_wait_for_the_write_of_the_one_before(monkeypatch):
    """The page-locked writes wait on the device's queue behind the work before them; a second upload must
    take another staging buffer instead of waiting for the first one's write (here held back by a user
    event the queue waits on) and the third, with no buffer left, waits for the oldest write."""
    import threading

    import pyopencl as cl

    from tunecl.backend import copies, state

    monkeypatch.setattr(copies, "PINNED_LIMIT", 1024)
    monkeypatch.setattr(copies, "PINNED_UPLOADS", True)
    monkeypatch.setattr(copies, "STAGING_BUFFERS", 2)
    monkeypatch.setattr(copies, "_pinned", copies._PinnedStaging())
    st = state.get()
    st.device.flush()
    gate = cl.UserEvent(st.device.context)
    cl.enqueue_marker(st.queue, wait_for=[gate])   # the queue waits for the gate from here on
    hosts = [torch.randn(3000) for _ in range(3)]
    devices = []
    second = threading.Thread(target=lambda: devices.extend(h.to("opencl") for h in hosts[:2]), daemon=True)
    second.start()
    second.join(timeout=20)
    alive = second.is_alive()
    third = threading.Thread(target=lambda: devices.append(hosts[2].to("opencl")), daemon=True)
    if not alive:
        third.start()
        third.join(timeout=1)
        waited = third.is_alive()   # both buffers are read by writes behind the gate
    gate.set_status(cl.command_execution_status.COMPLETE)
    second.join(timeout=20)
    third.join(timeout=20) if not alive else None
    assert not alive, "the second upload waited for the first one's write"
    assert waited, "the third upload did not wait for a staging buffer"
    assert len(devices) == 3
    for h, d in zip(hosts, devices):
        assert torch.equal(d.cpu(), h)


def test_a_forked_child_stages_large_uploads_with_its_own_threads(monkeypatch):
    """The staging threads do not survive a fork; a child that uploads through the page-locked path must not
    wait for them (it gets a pool of its own). The child only copies on the host: OpenCL is not fork-safe,
    so the staging copy is run directly, the way the upload runs it."""
    import os
    import select
    import signal
    import threading
    import time

    from tunecl.backend import copies

    # the parent's pool with all its threads started and idle (each an idle-slot a child would think it has)
    started = threading.Barrier(copies.STAGING_THREADS)
    list(copies._copy_pool().map(lambda _: started.wait(10), range(copies.STAGING_THREADS)))
    time.sleep(0.1)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: stage 3 chunks through the pool, report, exit without cleanup
        try:
            src, view = np.arange(10, dtype=np.uint8), np.zeros(10, dtype=np.uint8)
            spans = range(0, 10, 4)[:copies.STAGING_THREADS]
            list(copies._copy_pool().map(lambda s: np.copyto(view[s:s + 4], src[s:s + 4]), spans))
            src[4 * len(spans):] = 0
            os.write(write, b"ok" if (view == src).all() else b"bad")
        finally:
            os._exit(0)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], 30)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        assert ready, "the child's staging copy hung"
        assert os.read(read, 8) == b"ok"
    finally:
        os.waitpid(pid, 0)
        os.close(read)
