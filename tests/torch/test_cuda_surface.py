"""The ``torch.cuda`` calls users make, on ``torch.opencl`` and torch's device-generic APIs (``torch.Event``,
``torch.Stream``, ``torch.accelerator``, ``torch.amp.GradScaler``), checked against torch.cuda's documented
behaviour."""

from __future__ import annotations

import collections

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tunecl.backend import allocator, amp, graphs, state, streams

DEVICE = "opencl"


def _cl_device():
    return state.get().device.cl_device


def _live_stats() -> dict[str, int]:
    return torch.opencl.memory_stats()


# -- get_device_properties ----------------------------------------------------------------------------
@pytest.mark.parametrize("device", [None, 0, "opencl", "opencl:0", torch.device("opencl", 0)])
def test_device_properties_are_an_object_with_cuda_attribute_names(device):
    props = torch.opencl.get_device_properties(device)
    d = _cl_device()
    assert not isinstance(props, dict)
    assert props.name == torch.opencl.get_device_name() == d.name.strip()
    assert props.total_memory == d.global_mem_size
    assert props.multi_processor_count == d.max_compute_units
    assert props.max_work_group_size == d.max_work_group_size
    assert props.max_work_item_sizes == tuple(d.max_work_item_sizes)
    assert props.shared_memory_per_block == d.local_mem_size
    assert props.max_alloc_size == d.max_mem_alloc_size
    assert props.type in ("gpu", "cpu", "accelerator", "other")
    assert props.name in repr(props) and "total_memory" in repr(props)
    with pytest.raises(AttributeError):   # frozen, like torch.cuda's
        props.name = "x"


def test_device_properties_keep_the_dict_keys_tunecl_uses():
    props = torch.opencl.get_device_properties()
    described = state.get().device.entry.describe()
    for key in ("index", "name", "type", "compute_units", "global_mem_bytes", "platform"):
        assert props[key] == described[key]
    assert props["index"] == props.index and props["compute_units"] == props.multi_processor_count
    with pytest.raises(KeyError):
        props["no_such_key"]


@pytest.mark.parametrize("device", [1, "opencl:1"])
def test_device_properties_of_a_missing_device_raise(device):
    with pytest.raises(RuntimeError, match="does not exist"):
        torch.opencl.get_device_properties(device)


# -- memory: mem_get_info, memory_stats with CUDA's names, memory_summary --------------------------------
def test_mem_get_info_is_free_and_total_bytes():
    free, total = torch.opencl.mem_get_info()
    assert isinstance(free, int) and isinstance(total, int)
    assert total == _cl_device().global_mem_size and 0 <= free <= total
    assert torch.accelerator.get_memory_info() == torch.opencl.mem_get_info("opencl:0")
    reserved = _live_stats()["reserved_bytes.all.current"]
    assert free == total - reserved


def test_mem_get_info_drops_by_what_a_new_tensor_reserves():
    torch.opencl.empty_cache()   # (a cache hit would reserve nothing new)
    before, _ = torch.opencl.mem_get_info()
    t = torch.empty(3 * 1000 + 7, device=DEVICE)
    after, _ = torch.opencl.mem_get_info()
    assert before - after == allocator.size_class(t.untyped_storage().nbytes())


def test_memory_stats_carry_cuda_key_names_beside_tunecls():
    stats = _live_stats()
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak", "allocated_bytes.all.allocated",
                "allocated_bytes.all.freed", "reserved_bytes.all.current", "reserved_bytes.all.peak",
                "reserved_bytes.all.allocated", "reserved_bytes.all.freed", "requested_bytes.all.current",
                "allocation.all.current", "allocation.all.allocated", "allocation.all.freed",
                "num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
                # tunecl's own
                "allocated_bytes", "reserved_bytes", "cached_bytes", "peak_allocated_bytes", "live_blocks"):
        assert isinstance(stats[key], int) and stats[key] >= 0, key
    assert stats["allocated_bytes.all.current"] == stats["allocated_bytes"]
    assert stats["reserved_bytes.all.current"] == stats["reserved_bytes"]
    assert stats["allocated_bytes.all.peak"] == stats["peak_allocated_bytes"]
    assert stats["requested_bytes.all.current"] == stats["requested_bytes"]
    assert stats["allocation.all.current"] == stats["live_blocks"]


def test_memory_stats_follow_an_allocation_and_its_free():
    torch.opencl.reset_accumulated_memory_stats()
    torch.opencl.reset_peak_memory_stats()
    start = _live_stats()
    assert start["allocated_bytes.all.allocated"] == start["allocated_bytes.all.freed"] == 0
    assert start["allocation.all.allocated"] == start["allocation.all.freed"] == 0
    assert start["allocated_bytes.all.peak"] == start["allocated_bytes.all.current"]
    t = torch.empty(5, 2049, device=DEVICE)
    nbytes = allocator.size_class(t.untyped_storage().nbytes())
    held = _live_stats()
    assert held["allocated_bytes.all.current"] - start["allocated_bytes.all.current"] == nbytes
    assert held["allocated_bytes.all.allocated"] == nbytes and held["allocation.all.allocated"] == 1
    assert held["allocated_bytes.all.peak"] == held["allocated_bytes.all.current"]
    assert held["allocation.all.current"] == start["allocation.all.current"] + 1
    assert torch.opencl.memory_allocated() == held["allocated_bytes.all.current"]
    del t
    freed = _live_stats()
    assert freed["allocated_bytes.all.freed"] == nbytes and freed["allocation.all.freed"] == 1
    assert freed["allocated_bytes.all.current"] == start["allocated_bytes.all.current"]
    assert freed["allocated_bytes.all.peak"] == held["allocated_bytes.all.peak"]   # the peak stays
    # what is held is what was allocated less what was freed, since the reset
    for kind in ("allocated_bytes", "reserved_bytes"):
        assert (freed[f"{kind}.all.current"] - start[f"{kind}.all.current"]
                == freed[f"{kind}.all.allocated"] - freed[f"{kind}.all.freed"]), kind


def test_an_allocation_beyond_the_device_counts_as_an_oom():
    before = _live_stats()["num_ooms"]
    too_big = _cl_device().max_mem_alloc_size + 1
    with pytest.raises(torch.OutOfMemoryError, match="largest single allocation"):
        torch.empty(too_big, dtype=torch.uint8, device=DEVICE)
    assert _live_stats()["num_ooms"] == before + 1


def test_memory_summary_is_a_table_in_cuda_layout():
    t = torch.empty(1000, device=DEVICE)
    text = torch.opencl.memory_summary()
    lines = text.splitlines()
    assert text.endswith("|\n") and all(len(line) == 77 and line[0] == line[-1] == "|" for line in lines)
    assert "Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed" in text
    stats = _live_stats()
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in lines
            if line.count("|") == 6}
    assert rows["Allocations"][0] == str(stats["allocation.all.current"])
    assert rows["Allocations"][2] == str(stats["allocation.all.allocated"])
    assert rows["Requested memory"][1:] == ["-", "-", "-"]   # (not tracked: shown as such, not as 0)
    assert set(rows) == {"Metric", "Allocated memory", "Requested memory", "Reserved memory", "Allocations"}
    short = torch.opencl.memory_summary(abbreviated=True)
    assert len(short.splitlines()) < len(lines) and "Cached" not in short
    del t


# -- events ----------------------------------------------------------------------------------------------
def test_torch_event_on_opencl_records_synchronizes_and_times():
    x = torch.randn(64, 48)
    start = torch.Event(device="opencl", enable_timing=True)
    middle, end = (torch.Event(device=DEVICE, enable_timing=True) for _ in range(2))
    assert isinstance(start, torch.opencl.Event) and isinstance(start, torch.Event)
    dx = x.to(DEVICE)
    start.record()
    y = dx * 2 + 1
    middle.record()
    z = y @ y.t()
    end.record()
    end.synchronize()
    assert end.query() and middle.query() and start.query()
    first, whole = start.elapsed_time(middle), start.elapsed_time(end)
    assert isinstance(first, float) and 0 <= first <= whole
    torch.testing.assert_close(z.cpu(), (x * 2 + 1) @ (x * 2 + 1).t())


def test_an_unrecorded_event_is_complete():
    event = torch.opencl.Event()
    assert event.query()   # torch.cuda: True when nothing was recorded
    event.synchronize()   # returns at once


def test_elapsed_time_needs_timing_and_recorded_events():
    timed, untimed = torch.opencl.Event(enable_timing=True), torch.opencl.Event()
    timed.record()
    untimed.record()
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        timed.elapsed_time(untimed)
    with pytest.raises(RuntimeError, match="recorded"):
        timed.elapsed_time(torch.opencl.Event(enable_timing=True))
    with pytest.raises(TypeError, match="torch.opencl.Event"):
        timed.elapsed_time(torch.Event(device="cpu"))


def test_event_arguments_torch_cannot_serve_raise():
    with pytest.raises(RuntimeError, match="between processes"):
        torch.Event(device=DEVICE, interprocess=True)
    with pytest.raises(RuntimeError, match="does not exist"):
        torch.opencl.Event(device="opencl:1")
    with pytest.raises(TypeError, match="opencl device"):
        torch.opencl.Event().record(torch.Stream(device="cpu"))


def test_torch_event_defaults_to_the_accelerator_and_leaves_other_devices_to_torch():
    assert torch.accelerator.current_accelerator() == torch.device(DEVICE)
    assert isinstance(torch.Event(), torch.opencl.Event)
    assert isinstance(torch.Event(0), torch.opencl.Event)   # an index of the current accelerator
    cpu_event = torch.Event(device="cpu")
    assert type(cpu_event) is streams._TorchEvent and isinstance(cpu_event, torch.Event)
    assert issubclass(streams._TorchEvent, torch.Event) and issubclass(torch.opencl.Event, torch.Event)


def test_an_event_cannot_be_recorded_in_a_graph_capture():
    a = torch.randn(8).to(DEVICE)
    g = torch.opencl.Graph()
    event = torch.opencl.Event()
    try:
        with pytest.raises(graphs.GraphCaptureError, match="event"), torch.opencl.graph(g):
            a * 2
            event.record()
    finally:
        g.reset()
    assert not graphs.capturing() and event.query()


# -- streams ---------------------------------------------------------------------------------------------
def test_every_stream_is_the_one_queue():
    s = torch.opencl.Stream()
    assert isinstance(s, torch.Stream) and isinstance(torch.Stream(device=DEVICE), torch.opencl.Stream)
    assert s == torch.opencl.current_stream() == torch.opencl.default_stream()
    assert s == torch.accelerator.current_stream()
    assert s.device == torch.device(DEVICE, 0) and s.stream_id == 0
    assert torch.opencl.Stream(priority=-1) == s
    assert isinstance(s.native_handle(), int) and s.native_handle()
    cpu_stream = torch.Stream(device="cpu")
    assert type(cpu_stream) is streams._TorchStream and isinstance(cpu_stream, torch.Stream)


def test_work_on_a_side_stream_is_ordered_like_cuda_semantics_require():
    """torch.cuda's side-stream pattern: work in ``with torch.cuda.stream(s)``, then the current stream
    waits for ``s``; the results are what the CPU computes."""
    x = torch.randn(33, 17)
    dx = x.to(DEVICE)
    side = torch.opencl.Stream()
    with torch.opencl.stream(side) as entered:
        assert entered is side
        y = (dx * 3).relu()
        done = side.record_event()
    torch.opencl.current_stream().wait_stream(side)
    torch.opencl.current_stream().wait_event(done)
    with torch.Stream(device=DEVICE):
        z = y + dx
    side.synchronize()
    assert done.query()
    # a stream's query needs a marker enqueued now, which even an idle queue completes a moment later
    assert any(side.query() for _ in range(1000))
    torch.testing.assert_close(z.cpu(), (x * 3).relu() + x)
    with torch.opencl.stream(None):
        torch.testing.assert_close((dx - 1).cpu(), x - 1)


def test_streams_refuse_what_is_not_theirs():
    s = torch.opencl.current_stream()
    with pytest.raises(TypeError, match="torch.opencl.Event"):
        s.wait_event(torch.Event(device="cpu"))
    with pytest.raises(TypeError, match="opencl device"):
        s.wait_stream(torch.Stream(device="cpu"))
    with pytest.raises(TypeError, match="opencl device"):
        torch.opencl.set_stream(torch.Stream(device="cpu"))
    with pytest.raises(TypeError, match="opencl device"):
        torch.opencl.stream(torch.Stream(device="cpu"))
    torch.opencl.set_stream(s)
    torch.accelerator.set_stream(s)


# -- torch.accelerator -----------------------------------------------------------------------------------
def test_accelerator_is_opencl_and_synchronizes_it():
    assert torch.accelerator.current_accelerator() == torch.device(DEVICE)
    assert torch.accelerator.is_available() and torch.accelerator.device_count() == 1
    x = torch.randn(40, 40)
    y = x.to(DEVICE) @ x.to(DEVICE)
    event = torch.opencl.Event()
    event.record()
    torch.accelerator.synchronize()
    assert event.query()   # everything enqueued before the call has finished
    torch.accelerator.synchronize("opencl:0")
    torch.accelerator.synchronize(0)
    with pytest.raises(RuntimeError, match="does not exist"):
        torch.accelerator.synchronize("opencl:1")
    torch.testing.assert_close(y.cpu(), x @ x, rtol=1e-4, atol=1e-4)


def test_compiled_code_calls_the_accelerator_routes_untraced():
    """torch.compile's generated code asks torch.accelerator.current_stream between graphs: the route runs
    as plain Python (no frame of tunecl traced, no warning about torch.Stream's C++ constructor)."""
    import warnings

    import torch._dynamo

    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).to(DEVICE)
    compiled = torch.compile(model, backend="eager")
    x = torch.randn(4, 8, device=DEVICE)
    traced = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        original = torch._dynamo.convert_frame.ConvertFrameAssert.__call__

        def spy(self, frame, *args, **kwargs):
            traced.append(frame.f_code.co_filename)
            return original(self, frame, *args, **kwargs)

        torch._dynamo.convert_frame.ConvertFrameAssert.__call__ = spy
        try:
            for _ in range(2):
                compiled(x).sum().backward()
        finally:
            torch._dynamo.convert_frame.ConvertFrameAssert.__call__ = original
            torch._dynamo.reset()
    assert traced and not [f for f in traced if "tunecl" in f], traced
    assert not [w for w in caught if "Dynamo does not know how to trace" in str(w.message)]
    assert torch.accelerator.current_stream() == torch.opencl.current_stream()


def test_accelerator_capability_lists_the_dtypes_the_device_stores():
    dtypes = torch.accelerator.get_device_capability()["supported_dtypes"]
    assert {torch.float32, torch.float16, torch.int64, torch.bool, torch.bfloat16} <= dtypes
    assert torch.float64 not in dtypes   # refused at creation
    for dtype in dtypes:   # each can be allocated and converted to float32 (complex64 to itself) and back
        t = torch.ones(2, dtype=dtype).to(DEVICE)
        other = torch.complex64 if dtype.is_complex else torch.float32
        assert t.to(other).to(dtype).cpu().tolist() == torch.ones(2, dtype=dtype).tolist()
    with pytest.raises(RuntimeError, match="does not exist"):
        torch.accelerator.get_device_capability("opencl:1")


def test_accelerator_memory_calls_read_the_allocator():
    t = torch.empty(4097, device=DEVICE)
    stats = torch.accelerator.memory_stats()
    assert isinstance(stats, collections.OrderedDict) and list(stats) == sorted(stats)
    assert torch.accelerator.memory_allocated() == torch.opencl.memory_allocated() == stats[
        "allocated_bytes.all.current"] > 0
    assert torch.accelerator.memory_reserved() == torch.opencl.memory_reserved()
    assert torch.accelerator.max_memory_allocated() == torch.opencl.max_memory_allocated()
    assert torch.accelerator.max_memory_reserved() == torch.opencl.max_memory_reserved()
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == torch.accelerator.memory_allocated()
    torch.accelerator.reset_accumulated_memory_stats()
    assert torch.accelerator.memory_stats()["allocated_bytes.all.allocated"] == 0
    del t
    torch.accelerator.empty_cache()
    assert torch.opencl.memory_stats()["cached_bytes"] == 0


# -- torch.amp.GradScaler --------------------------------------------------------------------------------
def test_torch_grad_scaler_for_opencl_is_tunecls():
    scaler = torch.amp.GradScaler("opencl")
    assert isinstance(scaler, amp.GradScaler) and isinstance(scaler, torch.amp.GradScaler)
    assert isinstance(torch.amp.GradScaler(device=torch.device(DEVICE)), amp.GradScaler)
    assert torch.amp.GradScaler("opencl", 1024.0).get_scale() == 1024.0   # positional arguments
    assert type(torch.amp.GradScaler("cpu")) is torch.amp.GradScaler


def test_torch_grad_scaler_steps_match_cpu(strict):
    """Three SGD steps through torch.amp.GradScaler(device); the second step's gradients hold an inf, so it
    is skipped and the scale backs off, as on the CPU."""
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
    runs = {}
    for device in ("cpu", DEVICE):
        model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
        model.load_state_dict(reference.state_dict())
        model.to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler(device, init_scale=2.0**10, growth_interval=2)
        scales = []
        for step in range(3):
            opt.zero_grad()
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            scaler.scale(loss).backward()
            if step == 1:
                model[0].weight.grad[0, 0] = float("inf")
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        runs[device] = (model, scales)
    assert runs[DEVICE][1] == runs["cpu"][1] == [1024.0, 512.0, 512.0]
    for p_cpu, p_dev in zip(runs["cpu"][0].parameters(), runs[DEVICE][0].parameters()):
        torch.testing.assert_close(p_dev.cpu(), p_cpu, rtol=1e-5, atol=1e-6)


# -- is_bf16_supported -----------------------------------------------------------------------------------
def test_bf16_is_not_reported_as_supported():
    """No kernel computes in bfloat16 (its ops take the CPU fallback) and autocast casts to float16."""
    assert torch.opencl.is_bf16_supported() is False
    assert torch.opencl.is_bf16_supported(including_emulation=False) is False
    assert torch.bfloat16 not in torch.opencl.get_amp_supported_dtype()
    t = torch.ones(3, dtype=torch.bfloat16).to(DEVICE)   # stored and copied all the same
    assert t.dtype == torch.bfloat16 and t.cpu().tolist() == [1.0, 1.0, 1.0]
