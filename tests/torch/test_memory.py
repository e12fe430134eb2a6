"""The allocator, storages and the dtype rules of the opencl device."""

from __future__ import annotations

import copy
import io
import random

import pytest
import torch

from tunecl.backend import allocator, memory
from tunecl.backend.dtypes import UnsupportedDtypeError


def test_size_classes_waste_far_less_than_power_of_two_rounding():
    rng = random.Random(5)
    sizes = [rng.randint(1, 1 << 30) for _ in range(20000)] + [rng.randint(1, 1 << 20) for _ in range(20000)]
    worst_large, total_large, total_pow2, n_large = 0.0, 0.0, 0.0, 0
    for n in sizes:
        reserved = allocator.size_class(n)
        assert reserved >= n
        if n <= allocator.SMALL_LIMIT:
            assert reserved - n < allocator.SMALL_GRANULE  # at most 511 bytes wasted below 1 MiB
        else:
            waste = (reserved - n) / n
            worst_large = max(worst_large, waste)
            total_large += waste
            total_pow2 += ((1 << (n - 1).bit_length()) - n) / n
            n_large += 1
    assert worst_large < 1 / 16            # under 6.25 % for every request above 1 MiB
    assert total_large / n_large < 0.035   # about 3 % on average ...
    assert total_pow2 / n_large > 0.3      # ... where power-of-two rounding wastes over 30 %
    assert allocator.size_class(0) == allocator.SMALL_GRANULE
    assert allocator.size_class(3 << 20) == 3 << 20


def test_cached_blocks_are_reused_and_stats_track_them():
    torch.opencl.empty_cache()
    base = torch.opencl.memory_allocated()
    a = torch.empty(1000, device="opencl")           # 4000 B -> 4096 B class
    assert torch.opencl.memory_allocated() == base + 4096
    assert torch.opencl.memory_stats()["requested_bytes"] >= 4000
    ptr = memory.buffer_of(a)
    del a
    assert torch.opencl.memory_allocated() == base
    assert torch.opencl.memory_reserved() >= base + 4096  # kept in the cache
    b = torch.empty(1020, device="opencl")           # same class: the cached buffer comes back
    assert memory.buffer_of(b) is ptr
    assert torch.opencl.max_memory_allocated() >= base + 4096
    del b
    torch.opencl.empty_cache()
    assert torch.opencl.memory_reserved() == torch.opencl.memory_allocated()
    torch.opencl.reset_peak_memory_stats()
    assert torch.opencl.max_memory_allocated() == torch.opencl.memory_allocated()


def test_views_keep_the_storage_alive_and_pseudo_addresses_are_offsets():
    x = torch.arange(12.0, device="opencl").reshape(3, 4)
    view = x[1:, 2:]
    storage = x.untyped_storage().data_ptr()
    assert view.data_ptr() - storage == view.storage_offset() * 4
    del x
    assert view.cpu().tolist() == [[6.0, 7.0], [10.0, 11.0]]


def test_out_of_memory_names_the_size_and_the_device():
    with pytest.raises(torch.OutOfMemoryError, match=r"tried to allocate .*GiB on opencl:0 \(.+\)"):
        torch.empty(1 << 40, device="opencl")
    assert torch.empty(4, device="opencl").numel() == 4  # still usable afterwards


def test_float64_is_refused_never_downcast():
    x = torch.randn(3, dtype=torch.float64)
    for make in (lambda: x.to("opencl"), lambda: torch.zeros(2, dtype=torch.float64, device="opencl"),
                 lambda: torch.ones(2, device="opencl").double()):
        with pytest.raises(UnsupportedDtypeError, match="float64 is not supported on the OpenCL device; use float32"):
            make()
    # an explicit conversion on the way is fine
    assert x.to("opencl", torch.float32).dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                                   torch.int16, torch.int8, torch.uint8, torch.bool])
def test_storage_dtypes_round_trip(dtype):
    x = (torch.randn(3, 5) * 10).to(dtype)
    assert torch.equal(x.to("opencl").cpu(), x)
    assert torch.equal(x.t().to("opencl").cpu(), x.t())


def test_untyped_storage_deepcopy_save_and_load(tmp_path):
    s = torch.UntypedStorage(16, device="opencl")
    assert s.device == torch.device("opencl:0") and s.nbytes() == 16
    model = torch.nn.Linear(3, 2).to("opencl")
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3, device="opencl")).sum().backward()
    opt.step()
    clone = copy.deepcopy(model)
    assert clone.weight.device.type == "opencl"
    assert torch.equal(clone.weight.cpu(), model.weight.cpu())
    assert clone.weight.data_ptr() != model.weight.data_ptr()
    path = tmp_path / "ckpt.pt"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "view": model.weight[1:]}, path)
    loaded = torch.load(path)
    assert loaded["model"]["weight"].device.type == "opencl"
    assert torch.equal(loaded["model"]["weight"].cpu(), model.weight.cpu())
    assert loaded["view"].untyped_storage().data_ptr() == loaded["model"]["weight"].untyped_storage().data_ptr()
    opt2 = torch.optim.Adam(model.parameters())
    opt2.load_state_dict(loaded["opt"])
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"].cpu(), opt.state_dict()["state"][0]["exp_avg"].cpu())
    on_cpu = torch.load(path, map_location="cpu")
    assert on_cpu["model"]["bias"].device.type == "cpu"
    buffer = io.BytesIO()
    torch.save(torch.arange(5, device="opencl"), buffer)
    buffer.seek(0)
    assert torch.load(buffer).cpu().tolist() == [0, 1, 2, 3, 4]


def test_resize_grows_the_storage():
    x = torch.arange(4.0, device="opencl")
    x.resize_(3, 3)
    assert x.shape == (3, 3) and x.flatten()[:4].cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    e = torch.empty(0, device="opencl")
    e.resize_(10)
    assert e.untyped_storage().nbytes() >= 40


def test_printing(strict):
    x = torch.tensor([[1.5, -2.0], [0.25, 1e-3]], device="opencl")
    assert "device='opencl:0'" in repr(x)
    assert "grad_fn=<MulBackward0>" in repr(x.requires_grad_() * 2)
    assert repr(torch.arange(3, device="opencl")) == "tensor([0, 1, 2], device='opencl:0')"
    assert repr(torch.empty(0, 2, device="opencl")) == "tensor([], device='opencl:0', size=(0, 2))"
    assert str(torch.tensor(2.5, device="opencl")) == "tensor(2.5000, device='opencl:0')"
    big = torch.randn(300, 300)
    squeeze = lambda text: "".join(text.replace("device='opencl:0'", "").split()).replace(",)", ")")
    assert squeeze(repr(big.to("opencl"))) == squeeze(repr(big))


def test_a_temporary_reuses_the_buffer_of_the_one_before_among_many_live_blocks():
    keep = [torch.empty(100, device="opencl") for _ in range(300)]  # long-lived blocks (weights, say)
    x = torch.empty(3000, device="opencl")
    for _ in range(3):  # two results alternate: the old one dies after the new one exists
        y = x * 2.0
    created = memory.allocator.counts["buffers_created"]
    for _ in range(100):
        y = x * 2.0
    assert memory.allocator.counts["buffers_created"] == created
    assert len(keep) == 300 and y.numel() == 3000


def test_empty_tensors_recycle_their_dlpack_slots():
    """Zero-byte tensors (eval batch norm's saved statistics, say) take no buffer, but their DLPack
    slots come back like everyone else's: the slots do not pile up."""
    allocator = memory.allocator

    def slots() -> int:   # DLPack slots in use, cached with their blocks, or free: new ones only when none is
        return (len(allocator._blocks) + sum(map(len, allocator._idle.values())) + len(allocator._free_slots))

    torch.empty(0, device="opencl")
    before = slots()
    for _ in range(500):
        t = torch.empty(0, device="opencl")
        assert t.numel() == 0
    assert slots() <= before + 1


def test_slots_of_more_than_eight_dims_are_recycled_by_rank_not_freed():
    """torch reads a dead storage's DLManagedTensor just after its weak reference expires (possibly on
    another thread), so a slot is never freed: one of a rare rank is kept for the next tensor of it."""
    shape = (1,) * (allocator.MAX_DIMS_RECYCLED + 1) + (12_345,)
    torch.opencl.empty_cache()   # (no other cached block of the class)
    t = torch.ones(shape, device="opencl")
    address = t.untyped_storage().data_ptr()
    (slot,) = [b.slot for b in memory.allocator._blocks.values() if b.address == address]
    assert len(slot.shape) == len(shape)
    del t
    torch.opencl.memory_allocated()  # a sweep reclaims the dead block: cached with its slot
    caching = memory.allocator
    kept = [b.slot for idle in caching._idle.values() for b in idle] + caching._free_large_slots.get(len(shape), [])
    assert slot in kept
    u = torch.full(shape, 2.0, device="opencl")
    (used,) = [b.slot for b in caching._blocks.values() if b.address == u.untyped_storage().data_ptr()]
    assert used is slot   # reused
    assert u.shape == shape and u.cpu().sum().item() == 2.0 * 12_345


def test_a_dead_storage_s_block_serves_the_next_allocation_of_its_class():
    """A temporary dies before the next op allocates (``y = x * 2.0`` in a loop): the next allocation of its
    class gets its block (buffer and slot) with a fresh address; a live or other-class block never."""
    x = torch.arange(3000.0, device="opencl")
    allocator = memory.allocator
    (x * 2.0).sum()                          # warm: the plans exist
    before = torch.opencl.memory_stats()
    # (a dry run earlier in the process restores the counts, not the blocks: compare this test's changes)
    unaccounted = before["allocs"] - before["frees"] - before["live_blocks"]
    dead = x * 3.0                           # dies at once below
    buffer, address = memory.buffer_of(dead), dead.data_ptr()
    del dead
    y = x * 2.0                              # same class: gets its block
    assert memory.buffer_of(y) is buffer and y.data_ptr() != address
    after = torch.opencl.memory_stats()
    assert after["cache_hits"] >= before["cache_hits"] + 1
    assert after["buffers_created"] == before["buffers_created"]
    assert after["allocs"] == before["allocs"] + 2 and after["frees"] == before["frees"] + 1
    z = x * 4.0                              # y is alive: z must get another buffer
    assert memory.buffer_of(z) is not memory.buffer_of(y)
    small = torch.empty(10, device="opencl")  # a different class: z's block stays z's
    del small
    torch.testing.assert_close(y.cpu(), torch.arange(3000.0) * 2.0)
    torch.testing.assert_close(z.cpu(), torch.arange(3000.0) * 4.0)
    # the accounting matches the blocks: every live block counted once
    stats = torch.opencl.memory_stats()
    assert stats["allocated_bytes"] == sum(b.reserved for b in allocator._blocks.values())
    assert stats["requested_bytes"] == sum(b.requested for b in allocator._blocks.values())
    assert stats["allocs"] - stats["frees"] - stats["live_blocks"] == unaccounted
    assert stats["cached_bytes"] == sum(b.reserved for idle in allocator._idle.values() for b in idle)


def test_cache_hits_count_reused_buffers_not_reused_empty_blocks():
    def hits():
        return torch.opencl.memory_stats()["cache_hits"]

    torch.empty(0, device="opencl")
    before = hits()
    for _ in range(20):   # each dies at once; the next reuses its (bufferless) block
        torch.empty(0, device="opencl")
    assert hits() == before
    torch.empty(16, device="opencl")
    before = hits()
    for _ in range(20):   # the same with a buffer: every allocation reuses one
        torch.empty(16, device="opencl")
    assert hits() - before == 20


def test_a_dead_block_is_reused_behind_any_number_of_newer_live_ones():
    """A temporary of one class dies while many newer tensors of other classes live: the next allocation of
    its class gets its buffer (no new buffer)."""
    allocator = memory.allocator
    odd = torch.empty(123_456, device="opencl")            # a class nothing else here uses
    buffer = memory.buffer_of(odd)
    newer = [torch.empty(7 + k, device="opencl") for k in range(200)]
    del odd
    created = allocator.counts["buffers_created"]
    again = torch.empty(123_400, device="opencl")          # the same class
    assert memory.buffer_of(again) is buffer
    assert allocator.counts["buffers_created"] == created
    assert len(newer) == 200


def test_a_storage_only_cpp_holds_keeps_its_block():
    """A tensor autograd saved, with no Python reference left: its storage lives (torch keeps its Python
    object for it), so its buffer goes to no one until the graph is gone, and the backward reads it intact."""
    x = torch.ones(1000, device="opencl", requires_grad=True)
    t = torch.arange(1000.0, device="opencl")
    buffer = memory.buffer_of(t)
    y = (x * t).sum()
    del t
    others = [torch.full((1000,), 7.0, device="opencl") for _ in range(20)]   # the same class
    assert all(memory.buffer_of(o) is not buffer for o in others)
    y.backward()
    torch.testing.assert_close(x.grad.cpu(), torch.arange(1000.0))
    del y
    again = torch.empty(1000, device="opencl")
    assert memory.buffer_of(again) is buffer   # the graph is gone: its saved tensor's block came back


def test_storages_freed_on_another_thread_or_during_an_exception():
    """A storage that dies on another thread, or while an exception propagates, returns its block, and the
    exception stays the one raised."""
    import threading

    t = torch.empty(4321, device="opencl")
    buffer = memory.buffer_of(t)
    box = [t]
    del t
    worker = threading.Thread(target=box.clear)
    worker.start()
    worker.join()
    assert memory.buffer_of(torch.empty(4321, device="opencl")) is buffer

    seen = []

    def temporary() -> torch.Tensor:   # its only reference: the argument of the call that fails
        made = torch.empty(5432, device="opencl")
        seen.append(memory.buffer_of(made))
        return made

    with pytest.raises(TypeError, match="must be Tensor, not str"):
        torch.add(temporary(), "x")
    assert memory.buffer_of(torch.empty(5432, device="opencl")) is seen[0]


def test_a_reused_dlpack_slot_describes_each_new_tensor():
    """A slot whose struct already describes a tensor's layout gets only the new address written: any other
    size, stride, dtype or rank rewrites it, and so does a size list its caller changed in place."""
    size = [4, 5]
    cases = [((2, 3), (3, 1), torch.float32), ((3, 2), (2, 1), torch.float32), ((3, 2), (2, 1), torch.float32),
             ((3, 2), (1, 3), torch.float32), ((3, 2), (1, 3), torch.int32), ((6,), (1,), torch.int32),
             ((1, 6), (6, 1), torch.int32), ((1, 6), (1, 1), torch.int32), (size, [5, 1], torch.float32)]
    addresses = set()
    for shape, stride, dtype in cases + [(size, [5, 1], torch.float32)]:
        if shape is size:
            size[0] += 1   # the same list, another size: the second time (5, 5)
        t = memory.empty(shape, stride, dtype)
        assert (tuple(t.shape), t.stride(), t.dtype) == (tuple(shape), tuple(stride), dtype)
        assert t.data_ptr() not in addresses
        addresses.add(t.data_ptr())
        values = torch.arange(t.numel(), dtype=dtype).reshape(t.shape)
        t.copy_(values)
        assert torch.equal(t.cpu(), values)
        del t   # the next allocation of the class reuses the block and its slot


def test_outputs_allocated_together_are_tensors_of_their_own():
    """memory.Layouts (a call's outputs, one hold of the allocator's lock): each tensor has its layout, its own
    storage and the buffer handed out with it, and the statistics count each block."""
    layouts = memory.Layouts([((2, 3, 5), (15, 1, 3), torch.float32), ((7,), (1,), torch.float32),
                              ((0,), (1,), torch.float32), ((4,), (1,), torch.int64)])
    before = torch.opencl.memory_stats()
    for _ in range(3):   # the second and third take the blocks of the ones before
        tensors, buffers = layouts.empty()
        assert [(tuple(t.shape), t.stride(), t.dtype) for t in tensors] == [
            ((2, 3, 5), (15, 1, 3), torch.float32), ((7,), (1,), torch.float32), ((0,), (1,), torch.float32),
            ((4,), (1,), torch.int64)]
        assert [memory.buffer_of(t) for t in tensors] == buffers and buffers[2] is None
        assert len({t.untyped_storage().data_ptr() for t in tensors}) == 4
        for k, t in enumerate(tensors):
            t.copy_(torch.full(t.shape, k, dtype=t.dtype))
        for k, t in enumerate(tensors):
            assert torch.equal(t.cpu(), torch.full(t.shape, k, dtype=t.dtype))
    after = torch.opencl.memory_stats()
    assert after["live_blocks"] == before["live_blocks"] + 4
    assert after["allocated_bytes"] == before["allocated_bytes"] + 512 * 3   # (the empty one reserves nothing)
    del tensors, t
    assert torch.opencl.memory_stats()["allocated_bytes"] == before["allocated_bytes"]


def test_a_failed_allocation_among_several_gives_back_the_blocks_taken():
    layouts = memory.Layouts([((100,), (1,), torch.float32), ((1 << 40,), (1,), torch.float32)])
    before = torch.opencl.memory_stats()
    with pytest.raises(torch.OutOfMemoryError, match="tried to allocate"):
        layouts.empty()
    after = torch.opencl.memory_stats()
    assert (after["live_blocks"], after["allocated_bytes"]) == (before["live_blocks"], before["allocated_bytes"])


def test_dense_copies_of_several_tensors_keep_their_layouts():
    sources = [torch.empty(2, 3, 4, 5, device="opencl").to(memory_format=torch.channels_last),
               torch.empty(6, device="opencl"), torch.empty(3, 4, device="opencl").t(), torch.empty(0, device="opencl")]
    made, buffers = memory.empty_dense_many(sources)
    for source, t, buffer in zip(sources, made, buffers):
        assert (t.shape, t.stride(), t.dtype) == (source.shape, source.stride(), source.dtype)
        assert memory.buffer_of(t) is buffer and (t.data_ptr() != source.data_ptr() or not t.numel())


def test_outputs_allocated_together_give_back_their_blocks_when_torch_refuses_one(monkeypatch):
    layouts = memory.Layouts([((10,), (1,), torch.float32), ((20,), (1,), torch.float32), ((30,), (1,), torch.float32)])
    layouts.empty()   # (their blocks come back to the cache)
    from_dlpack = torch._C._from_dlpack
    calls = []

    def refuse_the_second(capsule):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("refused")
        return from_dlpack(capsule)

    before = torch.opencl.memory_stats()
    monkeypatch.setattr(torch._C, "_from_dlpack", refuse_the_second)
    with pytest.raises(RuntimeError, match="refused"):
        layouts.empty()
    monkeypatch.undo()
    after = torch.opencl.memory_stats()
    assert (after["live_blocks"], after["allocated_bytes"]) == (before["live_blocks"], before["allocated_bytes"])
    idle = [id(b) for blocks in memory.allocator._idle.values() for b in blocks]
    assert len(idle) == len(set(idle))   # each block cached once
    made, buffers = layouts.empty()
    assert len({memory.buffer_of(t) for t in made}) == 3 and buffers == [memory.buffer_of(t) for t in made]
