"""The allocator's statistics as ``torch.cuda`` reports them: CUDA's key names, ``mem_get_info``, a table.

tunecl has one pool (no large/small split), so only the ``.all.`` keys exist. The keys given are those
the allocator can fill truthfully; CUDA's ``active``, ``inactive_split`` and ``segment`` statistics
describe block splitting that this allocator does not do, and ``requested_bytes`` and ``allocation``
have no tracked peak, so those keys are absent rather than made up.
"""

from __future__ import annotations

from tunecl.backend import memory, state

# CUDA's counters that accumulate (reset by reset_accumulated_memory_stats), with the tunecl key they
# come from
_ACCUMULATED = {
    "allocated_bytes.all.allocated": "allocated_bytes_total",
    "reserved_bytes.all.allocated": "reserved_bytes_total",
    "allocation.all.allocated": "allocs",
    "allocation.all.freed": "frees",
    "num_alloc_retries": "oom_retries",
    "num_ooms": "ooms",
    "num_device_alloc": "buffers_created",
    "num_device_free": "buffers_released",
}
_baseline: dict[str, int] = {}


def cuda_stats(stats: dict[str, int]) -> dict[str, int]:
    """CUDA's names for tunecl's allocator ``stats`` (from :func:`tunecl.backend.memory.memory_stats`).

    ``*.allocated`` and ``*.freed`` count since the start or the last :func:`reset_accumulated`;
    ``.peak`` since the start or the last ``reset_peak_memory_stats``."""
    out = {cuda: stats.get(ours, 0) - _baseline.get(cuda, 0) for cuda, ours in _ACCUMULATED.items()}
    # what was freed is what was allocated and is not held now (the baseline holds what was held then)
    for kind in ("allocated_bytes", "reserved_bytes"):
        out[f"{kind}.all.freed"] = (out[f"{kind}.all.allocated"] - stats[kind]
                                    + _baseline.get(f"{kind}.all.current", 0))
    out.update({
        "allocated_bytes.all.current": stats["allocated_bytes"],
        "allocated_bytes.all.peak": stats["peak_allocated_bytes"],
        "reserved_bytes.all.current": stats["reserved_bytes"],
        "reserved_bytes.all.peak": stats["peak_reserved_bytes"],
        "requested_bytes.all.current": stats["requested_bytes"],
        "allocation.all.current": stats["live_blocks"],
    })
    return out


def reset_accumulated() -> None:
    """Start the accumulating counters (``*.allocated``, ``*.freed``, ``num_*``) from zero."""
    stats = memory.memory_stats()
    _baseline.clear()
    _baseline.update({cuda: stats.get(ours, 0) for cuda, ours in _ACCUMULATED.items()})
    _baseline["allocated_bytes.all.current"] = stats["allocated_bytes"]
    _baseline["reserved_bytes.all.current"] = stats["reserved_bytes"]


def mem_get_info() -> tuple[int, int]:
    """(free, total) bytes of device memory, as ``torch.cuda.mem_get_info``.

    OpenCL has no portable query for the memory other processes hold, so ``free`` is the global memory
    less what this process's allocator reserves (its tensors plus its cache)."""
    total = int(state.get().device.cl_device.global_mem_size)
    return max(0, total - memory.allocator.reserved), total


def _size(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= 768 * size:
            return f"{n // size:6d} {unit}"
    return f"{n:6d} B  "


def _count(n: int) -> str:
    return f"{n:10d}"


def summary(abbreviated: bool = False) -> str:
    """A table of the allocator's statistics in ``torch.cuda.memory_summary``'s layout (75 columns).

    Columns: current, peak, allocated and freed since the last reset; ``-`` where the allocator does not
    track the value. ``abbreviated`` leaves out the lines below the table (cache and graph bytes)."""
    stats = memory.memory_stats()
    cuda = cuda_stats(stats)
    rows = [
        ("Allocated memory", "allocated_bytes", _size),
        ("Requested memory", "requested_bytes", _size),
        ("Reserved memory", "reserved_bytes", _size),
        ("Allocations", "allocation", _count),
    ]
    name = state.get().device.name
    lines = ["=" * 75, f" tunecl OpenCL memory summary, opencl:0 ({name})"[:75], "-" * 75,
             f" OOMs: {cuda['num_ooms']:<10d} | allocation retries: {cuda['num_alloc_retries']:<10d}"
             f" | buffers created: {cuda['num_device_alloc']}", "=" * 75,
             "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  "]
    for label, key, fmt in rows:
        cells = [fmt(cuda[f"{key}.all.{column}"]) if f"{key}.all.{column}" in cuda else f"{'-':>10}"
                 for column in ("current", "peak", "allocated", "freed")]
        lines += ["-" * 75, f" {label:<21} | " + " | ".join(cells) + " "]
    lines.append("=" * 75)
    if not abbreviated:
        lines += [f" Cached (free) memory  | {_size(stats['cached_bytes'])}",
                  f" Held by graphs        | {_size(stats['graph_bytes'])}", "=" * 75]
    return "|" + "|\n|".join(line.ljust(75) for line in lines) + "|\n"
