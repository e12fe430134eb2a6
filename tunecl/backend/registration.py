"""Wires the backend into torch: renames PrivateUse1 to ``opencl`` and registers kernels and patches.

Uses the experimental ``_setup_privateuseone_for_python_backend`` (torch ≥ 2.11; its hooks and
DeviceGuard come from the private ``torch._C._acc``). :func:`register` is idempotent.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch

from tunecl.backend import (accelerator, amp, autocast, autograd_engine, copies, counters, default_compile, direct_calls,
                            fallback, foreach_runs, memory, modules, state, streams, weight_cache)
from tunecl.errors import Unsupported

BACKEND = "opencl"
_libraries: list[torch.library.Library] = []  # must stay referenced or the kernels vanish
_registered = False
_lock = threading.Lock()


class _Hooks(torch._C._acc.PrivateUse1Hooks if hasattr(torch._C, "_acc") else object):
    """What torch asks a PrivateUse1 backend about itself."""

    def is_available(self) -> bool:
        return state.device_if_available() is not None

    def has_primary_context(self, dev_id: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard if hasattr(torch._C, "_acc") else object):
    """The device guard: torch's Python guard supports a single device (index 0)."""

    def type_(self, _type: Any = torch._C._autograd.DeviceType.PrivateUse1) -> Any:   # (called for every op)
        return _type


def _setup_function() -> Callable[..., None]:
    from torch.utils import backend_registration

    setup = getattr(backend_registration, "_setup_privateuseone_for_python_backend", None)
    acc = getattr(torch._C, "_acc", None)
    if setup is None or acc is None or not hasattr(torch._C, "_from_dlpack"):
        raise ImportError(
            f"tunecl.backend needs torch 2.11-2.14 with the experimental Python PrivateUse1 backend API "
            f"(torch.utils.backend_registration._setup_privateuseone_for_python_backend and "
            f"torch._C._acc); this torch {torch.__version__} lacks it")
    return setup


def register() -> None:
    """Make ``opencl`` a torch device (once per process)."""
    global _registered
    with _lock:
        if _registered:
            return
        current = torch._C._get_privateuse1_backend_name()
        if current not in ("privateuseone", BACKEND):
            raise RuntimeError(f"PrivateUse1 is already taken by the {current!r} backend; tunecl.backend "
                               f"cannot also register {BACKEND!r} in this process")
        if current == "privateuseone":
            from tunecl.backend import device_module

            _setup_function()(BACKEND, backend_module=device_module, hook=_Hooks(), device_guard=_Guard())
        _register_kernels()
        _patch_storage()
        _patch_printing()
        modules.patch_module_apply()
        # torch.Event/Stream, torch.accelerator and torch.amp.GradScaler reach C++ paths a Python backend
        # cannot fill (see each module's docstring): route them to torch.opencl for this device
        streams.patch_torch_event_and_stream()
        accelerator.patch()
        amp.patch_torch_grad_scaler()
        autograd_engine.patch()
        default_compile.patch()   # torch.compile's default backend on opencl graphs: tunecl's
        _registered = True


def _written(op: torch._ops.OpOverload) -> tuple[tuple[int, str], ...]:
    """(position, name) of every argument ``op`` writes into: ``Tensor(a!)`` in its schema, and the
    destinations its schema does not mark (``_copy_from``'s ``dst``, :data:`fallback.HIDDEN_MUTATIONS`)."""
    hidden = fallback.HIDDEN_MUTATIONS.get(op._schema.name, ())
    return tuple((i, a.name) for i, a in enumerate(op._schema.arguments)
                 if (a.alias_info is not None and a.alias_info.is_write) or i in hidden)


def _out_arguments(op: torch._ops.OpOverload) -> tuple[tuple[int, str], ...]:
    """(position, name) of an out= overload's keyword-only written arguments (none for other overloads)."""
    return tuple((i, a.name) for i, a in enumerate(op._schema.arguments)
                 if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write)


def _to_meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    if isinstance(x, (list, tuple)) and any(isinstance(e, torch.Tensor) for e in x):
        return type(x)(_to_meta(e) for e in x)
    return x


def _dtype_key(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.dtype, x.dim() == 0
    if isinstance(x, (list, tuple)):
        return tuple(_dtype_key(e) for e in x)
    return type(x)


def _out_dtype_check(op: torch._ops.OpOverload, outs: tuple[tuple[int, str], ...]) -> Callable[..., None]:
    """torch's check of an out= tensor's dtype (``can_cast`` of the result type for most ops, the exact
    dtype for some), which its structured out= wrappers make and our ``.out`` kernels would skip: the
    op's meta kernel run once per signature of dtypes where some tensor's dtype differs from the first
    output's (the functional forms allocate outputs of the right dtype and never pay for it)."""
    passed: set[tuple] = set()

    def check(args: tuple, kwargs: dict[str, Any]) -> None:
        out = next((kwargs.get(n) for _, n in outs if isinstance(kwargs.get(n), torch.Tensor)), None)
        if out is None:
            return
        dtype = out.dtype
        if all(not isinstance(a, torch.Tensor) or a.dtype == dtype for a in args) and all(
                not isinstance(v, torch.Tensor) or v.dtype == dtype for v in kwargs.values()):
            return
        key = (tuple(_dtype_key(a) for a in args), tuple((k, _dtype_key(v)) for k, v in kwargs.items()))
        if key in passed:
            return
        try:
            op(*[_to_meta(a) for a in args], **{k: _to_meta(v) for k, v in kwargs.items()})
        except (NotImplementedError, TypeError):   # no meta kernel: nothing to check against
            pass
        passed.add(key)

    return check


def _kernel(name: str, adapter: Callable[..., Any], joins: bool = False) -> Callable[..., Any]:
    """Count calls of ``name``; launch a pending run of foreach calls first (:mod:`foreach_runs`; ``joins``:
    the kernel may join the run, and launches it itself where it does not); route an :class:`Unsupported`
    case to the CPU fallback. A kernel that writes into its arguments first tells :mod:`weight_cache`
    (transforms of a written weight are stale even when its version counter does not move, e.g. through
    ``w.data``)."""
    base, _, overload = name.partition(".")
    op = getattr(getattr(torch.ops.aten, base), overload or "default")
    counts = counters.op_counts
    full_name = fallback.op_name(op)
    written = _written(op)
    # (an op whose only writes are hidden ones made in some calls: evaluation batch norm writes nothing)
    written_only_if = op._schema.name in fallback.HIDDEN_MUTATIONS_ONLY_IF
    watched = weight_cache.watched
    outs = _out_arguments(op)
    check_out = _out_dtype_check(op, outs) if outs else None

    runs = foreach_runs

    def kernel(*args: Any, **kwargs: Any) -> Any:
        counts[full_name] += 1
        if runs.pending is not None and not joins:
            runs.flush()
        if check_out is not None:
            check_out(args, kwargs)
        if written and watched and (not written_only_if or fallback.hidden_writes(op._schema, args, kwargs)):
            for index, arg_name in written:
                weight_cache.note_write(args[index] if index < len(args) else kwargs.get(arg_name))
        try:
            return adapter(*args, **kwargs)
        except Unsupported as why:
            return fallback.run_on_cpu(op, args, kwargs, reason=str(why))

    kernel.__name__ = f"opencl_{base}_{overload}".rstrip("_")
    return kernel


def _register_kernels() -> None:
    from tunecl.backend.ops import foreach, kernel_table

    aten = torch.library.Library("aten", "IMPL")
    for name, adapter in kernel_table().items():
        direct_calls.kernels[name] = kernel = _kernel(name, adapter, joins=name in foreach.JOINABLE)
        aten.impl(name, kernel, "PrivateUse1")
    from tunecl.backend.ops import composite, core, sdpa

    for name, view in core.VIEW_KERNELS.items():   # (views read no data: a pending run may wait)
        aten.impl(name, view, "PrivateUse1")

    # autograd kernels that launch kernels themselves: a pending run first
    for name, adapter in {**composite.AUTOGRAD_KERNELS, **sdpa.AUTOGRAD_KERNELS}.items():
        aten.impl(name, foreach_runs.launching_first(adapter), "AutogradPrivateUse1")
    for name, shapes in sdpa.META_KERNELS.items():
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta"):
            aten.impl(name, shapes, "Meta")
    for base in fallback.CPU_AUTOGRAD_OPS:
        packet = getattr(torch.ops.aten, base)
        for overload in packet.overloads():
            aten.impl(f"{base}.{overload}" if overload != "default" else base,
                      foreach_runs.launching_first(fallback.cpu_autograd_route(getattr(packet, overload))),
                      "AutogradPrivateUse1")
    catch_all = torch.library.Library("_", "IMPL")
    catch_all.fallback(foreach_runs.launching_first(fallback.boxed_fallback), "PrivateUse1")
    # Autocast: ops without a cast policy fall through; torch has no policies for this key, so
    # autocast.py registers CUDA's (without them torch.autocast("opencl") would do nothing)
    catch_all.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    autocast.register()
    cpu = torch.library.Library("aten", "IMPL")
    cpu.impl("_pin_memory", copies.pin_memory_cpu, "CPU")
    # A copy from or into a lazy conjugate/negative view reaches our _copy_from with its bit set (it
    # applies the bit itself): the generic fallback of those keys would clone the view, and the clone's
    # copy lands in _copy_from again, recursing until the C++ stack overflows.
    for key in ("Conjugate", "Negative"):
        for name in ("_copy_from", "_copy_from_and_resize"):
            cpu.impl(name, torch.library.fallthrough_kernel, key)
    _libraries.extend([aten, catch_all, cpu])


def _patch_storage() -> None:
    """``torch.UntypedStorage(n, device="opencl")`` would reach the (absent) C++ PrivateUse1
    allocator and crash; deepcopy and torch.load take that path. Serve it from our allocator."""
    original = torch.UntypedStorage.__new__
    if getattr(original, "_tunecl", False):
        return

    @functools.wraps(original)
    def untyped_storage_new(cls: type, *args: Any, device: Any = None, **kwargs: Any) -> Any:
        if device is not None and torch.device(device).type == BACKEND:
            state.check_index(device)
            if len(args) > 1 or kwargs or (args and not isinstance(args[0], int)):
                return original(cls, *args, **kwargs).to(device=torch.device(device))
            return memory.empty([args[0] if args else 0], [1], torch.uint8).untyped_storage()
        if device is not None:
            kwargs["device"] = device
        return original(cls, *args, **kwargs)

    untyped_storage_new._tunecl = True
    torch.UntypedStorage.__new__ = untyped_storage_new


def _patch_printing() -> None:
    """Format opencl tensors from a CPU copy: one download instead of ~15 small device ops
    (abs, masked_select, ...) that printing would otherwise run; the device= suffix is kept."""
    tensor_str = sys.modules["torch._tensor_str"]
    original = getattr(tensor_str, "_tensor_str", None)
    if original is None or getattr(original, "_tunecl", False):
        return

    @functools.wraps(original)
    def _tensor_str(self: torch.Tensor, indent: int) -> str:
        if self.device.type == BACKEND:
            self = copies.to_cpu(self.detach())
        return original(self, indent)

    _tensor_str._tunecl = True
    tensor_str._tensor_str = _tensor_str
