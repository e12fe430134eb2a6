"""``torch.opencl``: the device module of the opencl backend, mirroring ``torch.cuda`` where it fits.

This module object itself is registered as ``torch.opencl``. There is exactly one device,
``opencl:0`` (``TUNECL_DEVICE`` selects which OpenCL device that is); other indices raise. Random
numbers come from torch's CPU default generator, so ``manual_seed`` seeds that generator. Events and
streams: :mod:`tunecl.backend.streams` (one stream, the device's in-order queue); memory statistics under
``torch.cuda``'s names: :mod:`tunecl.backend.memory_report`.
"""

from __future__ import annotations

import torch

from tunecl.backend import foreach_runs, graphed, graphs, memory, memory_report, properties, state, streams
from tunecl.backend.properties import DeviceProperties
from tunecl.backend.state import check_index

# record once, replay without Python (see tunecl.backend.graphs): torch.opencl.graph(g) like torch.cuda.graph
Graph = OpenCLGraph = graphs.Graph
GraphCaptureError = graphs.GraphCaptureError
graph = graphs.graph
make_graphed_callables = graphed.make_graphed_callables
# events and streams like torch.cuda's; every stream is the device's one in-order queue
Event = streams.Event
Stream = streams.Stream
StreamContext = streams.StreamContext
stream = streams.stream
current_stream = streams.current_stream
default_stream = streams.default_stream
set_stream = streams.set_stream

DeviceLike = torch.device | str | int | None


def is_available() -> bool:
    return state.device_if_available() is not None


def is_initialized() -> bool:
    return state._state is not None


def _lazy_init() -> None:
    state.get()


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return 1 if is_available() else 0


def current_device() -> int:
    return 0


def set_device(device: DeviceLike) -> None:
    check_index(device)


def get_device_name(device: DeviceLike = None) -> str:
    check_index(device)
    return state.get().device.name


def get_device_properties(device: DeviceLike = None) -> DeviceProperties:
    """The OpenCL device's description: ``name``, ``total_memory``, ``multi_processor_count``,
    ``max_work_group_size``, ... (see :class:`~tunecl.backend.properties.DeviceProperties`)."""
    check_index(device)
    return properties.of(state.get().device)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """False: bfloat16 tensors can be stored and copied, but no kernel computes in bfloat16 (their ops take
    the CPU fallback) and autocast casts to float16 only. Emulation, which CUDA counts when
    ``including_emulation`` is True, is the CPU fallback here, so it does not count either."""
    return False


def synchronize(device: DeviceLike = None) -> None:
    """Wait until every command enqueued on the device has finished; raises the IndexError of a gather or
    scatter that met an index out of range."""
    check_index(device)
    foreach_runs.flush()
    st = state.get()
    st.device.synchronize()
    st.raise_index_fault()


# -- random numbers: the CPU default generator serves the device ------------------------------------
def manual_seed(seed: int) -> None:
    # Not torch.manual_seed: that calls back into manual_seed_all of this module.
    torch.default_generator.manual_seed(int(seed))


manual_seed_all = manual_seed


def seed() -> None:
    torch.default_generator.seed()


seed_all = seed


def initial_seed() -> int:
    return torch.default_generator.initial_seed()


def get_rng_state(device: DeviceLike = None) -> torch.Tensor:
    check_index(device)
    return torch.default_generator.get_state()


def set_rng_state(new_state: torch.Tensor, device: DeviceLike = None) -> None:
    check_index(device)
    torch.default_generator.set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state()]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    set_rng_state(new_states[0])


# -- memory ----------------------------------------------------------------------------------------
def memory_stats(device: DeviceLike = None) -> dict[str, int]:
    """Allocator statistics: tunecl's keys (allocated/requested/reserved/cached bytes, peaks, counts) and
    ``torch.cuda``'s names for those it can fill (``allocated_bytes.all.current``, ``.peak``,
    ``reserved_bytes.all.current``, ``num_alloc_retries``, ...; see :mod:`tunecl.backend.memory_report`)."""
    check_index(device)
    stats = memory.memory_stats()
    return {**stats, **memory_report.cuda_stats(stats)}


def memory_summary(device: DeviceLike = None, abbreviated: bool = False) -> str:
    """A printable table of the allocator's statistics, in ``torch.cuda.memory_summary``'s layout."""
    check_index(device)
    return memory_report.summary(abbreviated)


def mem_get_info(device: DeviceLike = None) -> tuple[int, int]:
    """(free, total) device memory in bytes; ``free`` is the memory this process has not reserved (OpenCL
    cannot see other processes' use)."""
    check_index(device)
    return memory_report.mem_get_info()


def memory_allocated(device: DeviceLike = None) -> int:
    """Bytes held by live tensors (their size classes)."""
    return memory_stats(device)["allocated_bytes"]


def max_memory_allocated(device: DeviceLike = None) -> int:
    return memory_stats(device)["peak_allocated_bytes"]


def memory_reserved(device: DeviceLike = None) -> int:
    """Bytes held by the allocator: live tensors plus the cache."""
    return memory_stats(device)["reserved_bytes"]


def max_memory_reserved(device: DeviceLike = None) -> int:
    return memory_stats(device)["peak_reserved_bytes"]


def empty_cache() -> None:
    """Return cached, unused device buffers to the driver."""
    memory.empty_cache()


def reset_peak_memory_stats(device: DeviceLike = None) -> None:
    check_index(device)
    memory.allocator.reset_peak()


def reset_accumulated_memory_stats(device: DeviceLike = None) -> None:
    """Start ``memory_stats``'s accumulating ``torch.cuda`` counters (``*.allocated``, ``*.freed``,
    ``num_*``) from zero; tunecl's own counts keep running."""
    check_index(device)
    memory_report.reset_accumulated()


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float16]


class device:
    """Context manager selecting a device; only ``opencl:0`` exists."""

    def __init__(self, device: DeviceLike):
        check_index(device)

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False
