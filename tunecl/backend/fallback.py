"""The CPU fallback: a safety net for ops without an OpenCL kernel, never the plan.

``TUNECL_FALLBACK`` decides what happens when an op would take it: ``warn`` (default; once per op),
``silent``, or ``error`` (raise :class:`FallbackError` naming the op, so tests prove what runs on
the device). The fallback downloads every opencl tensor (keeping its strides), runs the op on the
CPU, writes mutated arguments back, and uploads new results. Ops that only return views of their
inputs are metadata work: they are redispatched to the CPU kernel, which builds the view on the same
storage, and never count as fallbacks.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

from tunecl import config
from tunecl.backend import copies, counters, state, weight_cache
from tunecl.backend.operands import is_device

CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)

# Arguments some ops mutate without saying so in their schema (positional indices).
HIDDEN_MUTATIONS: dict[str, tuple[int, ...]] = {
    "aten::native_batch_norm": (3, 4),  # running_mean, running_var
    "aten::_copy_from": (1,),           # dst (what Tensor.copy_ reaches for an opencl tensor)
    "aten::_copy_from_and_resize": (1,),
}
# the argument without which an op's hidden writes do not happen (evaluation batch norm writes nothing)
HIDDEN_MUTATIONS_ONLY_IF: dict[str, int] = {"aten::native_batch_norm": 5}   # training


def hidden_writes(schema: torch.FunctionSchema, args: tuple, kwargs: dict[str, Any]) -> tuple[int, ...]:
    """The positions of the arguments a call of ``schema``'s op writes without its schema marking them."""
    hidden = HIDDEN_MUTATIONS.get(schema.name, ())
    flag = HIDDEN_MUTATIONS_ONLY_IF.get(schema.name)
    if hidden and flag is not None:
        value = args[flag] if flag < len(args) else kwargs.get(schema.arguments[flag].name)
        if not value:
            return ()
    return hidden

_warned: set[str] = set()
_warn_lock = threading.Lock()


class FallbackError(RuntimeError):
    """An op would run on the CPU fallback while ``TUNECL_FALLBACK=error``."""


def op_name(op: torch._ops.OpOverload) -> str:
    """``aten::add.out`` style name (``aten::relu`` for default overloads)."""
    return op.name()


def check_allowed(name: str, reason: str = "") -> None:
    """Apply ``TUNECL_FALLBACK`` to a fallback of ``name``: warn once, stay silent or raise (the State's
    ``on_fallback``, which a dry run's State replaces)."""
    mode = config.get().fallback
    detail = f" ({reason})" if reason else ""
    if mode == "error":
        raise FallbackError(f"{name} has no OpenCL kernel for this call{detail}; TUNECL_FALLBACK=error "
                            f"forbids running it on the CPU")
    if mode == "warn":
        with _warn_lock:
            first = name not in _warned
            _warned.add(name)
        if first:
            warnings.warn(f"tunecl: {name} runs on the CPU fallback{detail} (slow: copies to the host "
                          f"and back). TUNECL_FALLBACK=silent hides this, =error raises.", stacklevel=3)
    elif mode != "silent":
        raise ValueError(f"TUNECL_FALLBACK must be warn, silent or error, not {mode!r}")


state.provide(on_fallback=check_allowed)


def run_on_cpu(op: torch._ops.OpOverload, args: tuple, kwargs: dict[str, Any], *, name: str | None = None,
               reason: str = "") -> Any:
    """Run ``op`` on the CPU for opencl arguments and map the results back (a counted fallback)."""
    name = name or op_name(op)
    state.get().on_fallback(name, reason)
    counters.fallback_counts[name] += 1
    return _execute(op, args, kwargs)


def _to_cpu(x: Any, storages: dict[int, torch.Tensor]) -> Any:
    """The CPU stand-in of an argument: an opencl tensor becomes a host copy with its sizes, strides and
    lazy conjugate/negative bit (a view of the host copy of its storage, kept in ``storages`` by the
    stand-in's id, which is what a mutation writes back)."""
    if is_device(x):
        host = copies.host_view(x)
        if copies.has_math_bits(x):
            physical = host
            if x.is_conj():
                host = host.conj()
            if x.is_neg():
                host = torch._neg_view(host)
            storages[id(host)] = physical
        return host
    if isinstance(x, (list, tuple)) and any(is_device(e) for e in x):
        return type(x)(_to_cpu(e, storages) for e in x)
    if isinstance(x, torch.device) and x.type == "opencl":
        return torch.device("cpu")
    return x


def _involves_device(x: Any) -> bool:
    if is_device(x):
        return True
    if isinstance(x, (list, tuple)):
        return any(_involves_device(e) for e in x)
    return isinstance(x, torch.device) and x.type == "opencl"


def _execute(op: torch._ops.OpOverload, args: tuple, kwargs: dict[str, Any]) -> Any:
    schema = op._schema
    hidden = hidden_writes(schema, args, kwargs)
    mutated: list[tuple[Any, Any]] = []   # (device argument, its CPU stand-in)

    def writes(index: int | None, arg_name: str | None) -> bool:
        for i, argument in enumerate(schema.arguments):
            if i == index or argument.name == arg_name:
                info = argument.alias_info
                return (info is not None and info.is_write) or i in hidden
        return False

    storages: dict[int, torch.Tensor] = {}
    cpu_args = []
    for i, a in enumerate(args):
        c = _to_cpu(_rewrapped(a, schema, i, None), storages)
        if c is not a and writes(i, None):
            mutated.append((a, c))
        cpu_args.append(c)
    cpu_kwargs = {}
    for k, v in kwargs.items():
        c = _to_cpu(_rewrapped(v, schema, None, k), storages)
        if c is not v and writes(None, k):
            mutated.append((v, c))
        cpu_kwargs[k] = c

    result = op(*cpu_args, **cpu_kwargs)

    stand_ins: dict[int, torch.Tensor] = {}
    for dev, host in mutated:
        if weight_cache.watched:   # a weight written here: its cached transforms are stale
            weight_cache.note_write(dev)
        pairs = zip(dev, host) if isinstance(dev, (list, tuple)) else [(dev, host)]
        for d, h in pairs:
            if is_device(d):
                if h.shape != d.shape:
                    d.resize_(h.shape)
                copies.upload_into(d, storages.get(id(h), h))
                stand_ins[id(h)] = d
    any_device = any(_involves_device(a) for a in args) or any(_involves_device(v) for v in kwargs.values())
    return _map_results(result, stand_ins, any_device, op)


_TENSOR_TYPES = ("Tensor", "Tensor?")


def _rewrapped(value: Any, schema: torch._C.FunctionSchema, index: int | None, name: str | None) -> Any:
    """A Python number passed for a ``Tensor`` argument as a 0-dim CPU tensor again. torch hands a Python
    kernel the wrapped-number tensor of ``x % 3`` as the number ``3``; the CPU op's schema wants the tensor
    (int64, the default float dtype, complex64 or bool, as torch's wrapped numbers promote)."""
    if not isinstance(value, (bool, int, float, complex)):
        return value
    arguments = schema.arguments
    argument = (arguments[index] if index is not None and index < len(arguments)
                else next((a for a in arguments if a.name == name), None))
    if argument is None or str(argument.type) not in _TENSOR_TYPES:
        return value
    if isinstance(value, bool):
        dtype = torch.bool
    elif isinstance(value, int):
        dtype = torch.int64
    elif isinstance(value, float):
        dtype = torch.get_default_dtype()
    else:
        dtype = torch.complex64
    return torch.tensor(value, dtype=dtype)


def _map_results(out: Any, stand_ins: dict[int, torch.Tensor], any_device: bool,
                 op: torch._ops.OpOverload) -> Any:
    if isinstance(out, torch.Tensor):
        if id(out) in stand_ins:
            return stand_ins[id(out)]      # an in-place/out= result: the original device tensor
        if any_device and out.device.type == "cpu":
            if out.layout != torch.strided:
                raise RuntimeError(f"{op_name(op)} gives a {out.layout} tensor, and opencl tensors are strided "
                                   f"only: {out.layout} is not supported on the OpenCL device (use it on the CPU)")
            return copies.upload(out)
        return out
    if isinstance(out, (list, tuple)):
        return type(out)(_map_results(o, stand_ins, any_device, op) for o in out)
    return out


def _is_view_op(op: torch._ops.OpOverload) -> bool:
    returns = op._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def boxed_fallback(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    """The ``PrivateUse1`` fallback kernel: views are redispatched, everything else runs on the CPU."""
    if _is_view_op(op):
        counters.op_counts[op_name(op)] += 1
        return op.redispatch(CPU_KEYS, *args, **kwargs)
    counters.op_counts[op_name(op)] += 1
    return run_on_cpu(op, args, kwargs, reason="no OpenCL kernel is registered")


def cpu_route(op: torch._ops.OpOverload, name: str) -> Callable[..., Any]:
    """A kernel that runs ``op`` on the CPU explicitly, counted and governed as a fallback of
    ``name`` (for ops whose device kernels do not exist yet, e.g. convolution)."""
    def kernel(*args: Any, **kwargs: Any) -> Any:
        return run_on_cpu(op, args, kwargs, name=name, reason="no device algorithm yet")
    return kernel


# Ops run on the CPU as a whole, autograd included, for opencl tensors: each makes float64 tensors on its
# input's device in its decomposition or its derivative formula, which the device does not store (float64
# is the CPU's accumulate type of float32, and so of every device but CUDA's, MPS's and XPU's:
# ``at::toAccumulateType``). quantile and nanquantile take q as double; linalg_matrix_rank and linalg_pinv
# (also reached by pinverse and linalg_lstsq's backward) make their default tolerances with
# ``at::zeros``/``at::full(..., kDouble)``; renorm's backward takes the norm in the accumulate type.
CPU_AUTOGRAD_OPS = ("quantile", "nanquantile", "linalg_matrix_rank", "linalg_pinv", "linalg_lstsq", "renorm")


def _map_tensors(x: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)) and any(isinstance(e, torch.Tensor) for e in x):
        return type(x)(_map_tensors(e, fn) for e in x)
    return x


def cpu_autograd_route(op: torch._ops.OpOverload) -> Callable[..., Any]:
    """An ``AutogradPrivateUse1`` kernel that runs ``op`` on the CPU, counted and governed as a fallback:
    opencl arguments go to the CPU and results come back by differentiable copies, so the op's own
    derivative runs on the CPU too. Arguments the op writes (``out=``) get the CPU results copied in."""
    name = op_name(op)
    written = [(i, a.name) for i, a in enumerate(op._schema.arguments)
               if a.alias_info is not None and a.alias_info.is_write]

    def to_cpu(x: Any) -> Any:
        if isinstance(x, torch.device) and x.type == "opencl":
            return torch.device("cpu")
        return _map_tensors(x, lambda t: t.to("cpu") if is_device(t) else t)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        state.get().on_fallback(name, "it makes float64 tensors, which the device does not store")
        counters.fallback_counts[name] += 1
        cpu_args = [to_cpu(a) for a in args]
        cpu_kwargs = {k: to_cpu(v) for k, v in kwargs.items()}
        result = op(*cpu_args, **cpu_kwargs)
        if written:
            with torch.no_grad():
                for index, arg_name in written:
                    dev = args[index] if index < len(args) else kwargs.get(arg_name)
                    host = cpu_args[index] if index < len(args) else cpu_kwargs.get(arg_name)
                    if is_device(dev):
                        if dev.shape != host.shape:
                            dev.resize_(host.shape)
                        dev.copy_(host)
            hosts = {id(cpu_args[i] if i < len(args) else cpu_kwargs.get(n)): (args[i] if i < len(args) else
                                                                              kwargs.get(n)) for i, n in written}
            return _map_tensors(result, lambda t: hosts.get(id(t), t))
        device = next(t.device for t in _tensors(args, kwargs) if is_device(t))   # (this key implies one)
        return _map_tensors(result, lambda t: t.to(device) if t.device.type == "cpu" else t)

    kernel.__name__ = f"opencl_cpu_{name.replace('::', '_').replace('.', '_')}"
    return kernel


def _tensors(args: tuple, kwargs: dict[str, Any]) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for x in list(args) + list(kwargs.values()):
        _map_tensors(x, found.append)
    return found
