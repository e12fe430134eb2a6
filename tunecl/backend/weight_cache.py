"""Transformed convolution weights kept between calls: a Winograd plan's filter transform U = G·f·Gᵀ
runs once per weight version instead of on every call.

A conv plan that can split its run (:class:`~tunecl.kernels.conv.conv_winograd.WinogradPlan`: ``u_floats``,
``transform_key``, ``transform_weight``, ``run_transformed``) runs through :func:`run_conv`; every
other plan runs as before.

**Key.** An entry is the transform of one weight view for one ``transform_key`` (F(m×m), direction,
channels, groups — not the batch, so every batch size shares it): the storage's address, the view's
storage offset, shape, strides and dtype. Storage addresses are never reused in a process (the
allocator's pseudo addresses only grow), so a new storage never meets an old entry.

**When an entry is stale.** Two checks, either one dropping or redoing the transform:

1. the weight's ``_version`` (torch bumps it on in-place ops through the tensor or any view of it:
   ``add_``, ``copy_`` under ``no_grad``, the per-tensor and foreach optimizer steps), checked on each hit;
2. writes at the storage level. ``_version`` misses writes through an alias with its own version
   counter: ``w.data.copy_(...)`` (``.data`` is a new tensor with a fresh counter), a tensor made with
   ``set_`` on the same storage, ``untyped_storage().copy_``; and torch 2.14 does not bump it for the
   fused optimizer steps (``Adam(fused=True)``, ``SGD(fused=True)``: ``_fused_adam_``/``_fused_sgd_``
   leave ``_version`` alone, on the CPU too). So the backend reports every write into
   an opencl storage: its kernels whose schema marks an argument written (``Tensor(a!)``, ``out=``)
   and ``_copy_from``'s destination call :func:`note_write` before they run (registration.py), and the
   CPU fallback does for what it writes back (fallback.py). A write into a storage that holds entries
   drops them. This costs a dict-truthiness check per mutating op while the cache is empty, ~0.2 µs
while it holds entries.

What stays invisible, and so is a hole: writes that never pass torch's dispatcher — into the
``cl.Buffer`` behind a tensor (``memory.buffer_of``) or through DLPack export to another library.
Call :func:`clear` after such a write, or switch the cache off.

**Policy** (``TUNECL_WINOGRAD_CACHE``, read per call, cheap): ``auto`` (default) caches the forward
convolution when grad mode is off (``torch.no_grad``, ``torch.inference_mode``: evaluation) and any
convolution whose weight does not require grad (frozen layers); a weight being trained changes every
step, so caching it would only hold memory — ``on`` caches those too (still correct, by the checks
above), ``off`` never caches.

**Memory.** The transforms are ordinary allocator blocks, so ``memory_stats()`` counts them. Entries
hold a weak reference to the weight's storage and are dropped once it dies (polled on each miss, by
:func:`stats` and before the allocator reports statistics or empties its cache); total bytes are capped at
``TUNECL_WINOGRAD_CACHE_MB`` (default 512) with least-recently-used eviction, and running out of
device memory drops them all before the allocator retries.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

import torch

from tunecl import config
from tunecl.backend import graphs, half, memory
from tunecl.backend.memory import buffer_of

ENV_MODE = "TUNECL_WINOGRAD_CACHE"
ENV_MB = "TUNECL_WINOGRAD_CACHE_MB"
FLOAT_BYTES = 4

_expired = torch.UntypedStorage._expired
_free_weak_ref = torch.UntypedStorage._free_weak_ref


class _Entry:
    __slots__ = ("key", "nbytes", "storage", "u", "version", "weak")

    def __init__(self, key: tuple, storage: int, u: torch.Tensor, nbytes: int, weak: int):
        self.key, self.storage, self.u, self.nbytes, self.weak = key, storage, u, nbytes, weak
        self.version = None


_lock = threading.RLock()
_entries: collections.OrderedDict[tuple, _Entry] = collections.OrderedDict()   # least recently used first
# storage address -> keys of its entries and the write listeners of :func:`watch_writes` (empty: nothing
# to watch)
watched: dict[int, set[Any]] = {}
_bytes = 0
counts: collections.Counter[str] = collections.Counter()


def _derive_settings(cfg: config.Config) -> tuple[str, int]:
    if cfg.winograd_cache not in config.WINOGRAD_CACHE_MODES:
        raise ValueError(f"{ENV_MODE} must be one of {', '.join(config.WINOGRAD_CACHE_MODES)}, "
                         f"not {cfg.winograd_cache!r}")
    return cfg.winograd_cache, max(0, cfg.winograd_cache_mb) << 20


# (mode, cap in bytes) from TUNECL_WINOGRAD_CACHE/_MB or an active config.override (~0.5 µs a call)
settings = config.Derived(_derive_settings, ENV_MODE, ENV_MB)


def allowed(weight: torch.Tensor, backward: bool = False) -> bool:
    """Whether the policy lets a convolution with ``weight`` use the cache (see the module docstring)."""
    if graphs.capturing() and weight.is_inference():   # (no version counter: a replay could not tell a change)
        return False
    mode = settings()[0]
    if mode == "auto":
        return not weight.requires_grad or (not backward and not torch.is_grad_enabled())
    return mode == "on"


def can_transform(plan: Any) -> bool:
    return getattr(plan, "transform_weight", None) is not None


class _VersionGuard:
    """A weight whose cached transform ``u`` a graph's commands read: the version of the weight ``u`` holds,
    and the plan that makes it. (The graph keeps ``u`` alive: the cache may drop its entry, never its buffer
    while the graph lives.)"""

    __slots__ = ("plan", "u", "version", "weight")

    def __init__(self, plan: Any, weight: torch.Tensor, u: torch.Tensor) -> None:
        self.plan, self.weight, self.u, self.version = plan, weight, u, weight._version

    def refresh(self) -> None:
        """Transform the weight into ``u`` again if it was written since."""
        version = self.weight._version
        if version != self.version:
            transform_into(self.plan, self.weight, self.u)
            self.version = version


def run_conv(plan: Any, a: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, *, backward: bool = False,
             bias: torch.Tensor | None = None) -> None:
    """``plan.run(a, weight as float32, out, bias=...)`` (``a``, ``out``, ``bias``: contiguous float32);
    from the cached transformed weight when the plan splits its run and the policy allows it."""
    bias_buf, bias_offset = (None, 0) if bias is None else (buffer_of(bias), bias.storage_offset())
    u = cached_transform(plan, weight, backward) if can_transform(plan) else None
    if u is not None:
        plan.run_transformed(buffer_of(a), buffer_of(u), buffer_of(out), a_offset=a.storage_offset(),
                             bias=bias_buf, bias_offset=bias_offset)
        return
    w = half.to_float32(weight)
    plan.run(buffer_of(a), buffer_of(w), buffer_of(out), a_offset=a.storage_offset(), b_offset=w.storage_offset(),
             bias=bias_buf, bias_offset=bias_offset)


def cached_transform(plan: Any, weight: torch.Tensor, backward: bool = False) -> torch.Tensor | None:
    """The transform of ``weight`` for a ``plan`` that splits its run (:func:`can_transform`), from the
    cache, when the policy allows it (:func:`allowed`) and it fits; None: run the whole plan. In a graph
    capture: where the transform was made now (a miss or a stale entry), the graph records it and every
    replay transforms again at that point; otherwise every replay first transforms the weight again if it
    was written since (the weight's version counter)."""
    if not allowed(weight, backward):
        return None
    u, made_now = _transformed(plan, weight)
    if u is not None and not made_now and graphs.capturing():
        graphs.before_each_replay(_VersionGuard(plan, weight, u).refresh)
    return u


def _transformed(plan: Any, weight: torch.Tensor) -> tuple[torch.Tensor | None, bool]:
    """The float32 tensor holding ``plan``'s transform of ``weight``'s current contents (transformed now
    on a miss or a stale entry), or None when it is larger than the cap; and whether this call enqueued
    the transform."""
    global _bytes
    storage = weight.untyped_storage()
    address = storage.data_ptr()
    key = (address, weight.storage_offset(), tuple(weight.shape), weight.stride(), weight.dtype, plan.transform_key)
    version = -1 if weight.is_inference() else weight._version   # inference tensors keep no counter
    with _lock:
        entry = _entries.get(key)
        if entry is not None and entry.version == version:
            _entries.move_to_end(key)
            counts["hits"] += 1
            return entry.u, False
        if entry is None:
            nbytes = plan.u_floats * FLOAT_BYTES
            cap = settings()[1]
            if nbytes > cap:
                counts["too_large"] += 1
                return None, False
            _sweep()
            while _entries and _bytes + nbytes > cap:
                _drop(next(iter(_entries.values())))
                counts["evictions"] += 1
            entry = _Entry(key, address, memory.empty_contiguous((plan.u_floats,), torch.float32), nbytes,
                           storage._weak_ref())
            _entries[key] = entry
            watched.setdefault(address, set()).add(key)
            _bytes += nbytes
            counts["misses"] += 1
        else:
            _entries.move_to_end(key)
            counts["stale"] += 1   # the version moved on: transform again into the same buffer
        transform_into(plan, weight, entry.u)
        entry.version = version
        return entry.u, True


def transform_into(plan: Any, weight: torch.Tensor, u: torch.Tensor) -> None:
    """Enqueue ``plan``'s transform of ``weight`` (as float32) into ``u``."""
    w = half.to_float32(weight)
    plan.transform_weight(buffer_of(w), buffer_of(u), w_offset=w.storage_offset())


def note_write(t: Any) -> None:
    """Drop the entries of the storage behind ``t`` (a tensor or a list of them; anything else is
    ignored): it is about to be written. Callers check ``watched`` first, so an empty cache costs
    nothing."""
    if isinstance(t, torch.Tensor):
        # (a host tensor's address never equals an opencl storage's pseudo address: no device check)
        try:
            keys = watched.get(t.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):   # no storage (sparse, meta wrappers): no weight
            return
        if keys:
            with _lock:
                for key in list(keys):
                    if isinstance(key, WriteListener):
                        key.on_write()
                        continue
                    entry = _entries.get(key)
                    if entry is not None:
                        _drop(entry)
                        counts["invalidations"] += 1
    elif isinstance(t, (list, tuple)):
        try:   # (an optimizer step writes ~1000 tensors, rarely a watched one: one pass over their storages)
            if watched.keys().isdisjoint(map(_storage_address, t)):
                return
        except (AttributeError, RuntimeError, NotImplementedError):   # not all tensors with storages
            pass
        for e in t:
            note_write(e)


def _storage_address(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class WriteListener:
    """Told (``on_write``) before each write into a storage it watches that passes the dispatcher, as the
    cache's entries are (see the module docstring): a holder of something derived from a tensor (the
    folded weights of :mod:`tunecl.backend.folding`) then knows it is stale, even where the tensor's
    version counter does not move."""

    def on_write(self) -> None:
        raise NotImplementedError


def watch_writes(t: torch.Tensor, listener: WriteListener) -> None:
    """Tell ``listener`` about writes into ``t``'s storage, until :func:`unwatch_writes`."""
    with _lock:
        watched.setdefault(t.untyped_storage().data_ptr(), set()).add(listener)


def unwatch_writes(storage: int, listener: WriteListener) -> None:
    """Stop telling ``listener`` about writes into the storage at address ``storage``."""
    with _lock:
        keys = watched.get(storage)
        if keys is not None:
            keys.discard(listener)
            if not keys:
                del watched[storage]


def _drop(entry: _Entry) -> None:
    """Forget ``entry`` (lock held): its transform's block goes back to the allocator when it is swept."""
    global _bytes
    del _entries[entry.key]
    keys = watched.get(entry.storage)
    if keys is not None:
        keys.discard(entry.key)
        if not keys:
            del watched[entry.storage]
    _bytes -= entry.nbytes
    _free_weak_ref(entry.weak)


def _sweep() -> None:
    """Drop the entries whose weight storage has died (lock held)."""
    for entry in [e for e in _entries.values() if _expired(e.weak)]:
        _drop(entry)
        counts["freed"] += 1


def sweep() -> None:
    with _lock:
        _sweep()


def clear() -> None:
    """Drop every entry (e.g. after writing into a weight's buffer behind torch's back)."""
    with _lock:
        for entry in list(_entries.values()):
            _drop(entry)


def _release_under_pressure() -> None:
    """The allocator is out of memory: drop everything unless another thread is using the cache now
    (it may be waiting for the allocator's lock: no waiting here)."""
    if _lock.acquire(blocking=False):
        try:
            clear()
        finally:
            _lock.release()


def stats() -> dict[str, int]:
    """Entries, bytes held and the counters (hits, misses, stale, invalidations, freed, evictions,
    too_large), after dropping the entries of dead storages."""
    with _lock:
        _sweep()
        return {"entries": len(_entries), "bytes": _bytes, **counts}


def reset_counts() -> None:
    counts.clear()


memory.allocator.before_sweep.append(sweep)
memory.allocator.under_pressure.append(_release_under_pressure)
