"""Reductions (sum, mean, amax/amin, argmax/argmin, max/min, var/std, norms) and softmax."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tunecl.backend import half, memory, state
from tunecl.backend.allocator import buffers as _buffers
from tunecl.backend.operands import kernel_dtype, operand
from tunecl.backend.ops import COMPOSITE_KEYS
from tunecl.errors import Unsupported
from tunecl.kernels.strided import Operand

DimArg = int | Sequence[int] | None


def reduced_dims(self: torch.Tensor, dim: DimArg) -> list[int]:
    """Normalised reduced dims; ``None`` or ``[]`` mean all dims (0-dim tensors reduce nothing)."""
    nd = self.dim()
    if nd == 0:
        return []
    if dim is None:
        return list(range(nd))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return list(range(nd)) if not dims else sorted({d % nd for d in dims})


def out_shape(self: torch.Tensor, dims: Sequence[int], keepdim: bool) -> list[int]:
    if keepdim:
        return [1 if d in dims else n for d, n in enumerate(self.shape)]
    return [n for d, n in enumerate(self.shape) if d not in dims]


def aligned(out: torch.Tensor, self: torch.Tensor, dims: Sequence[int], keepdim: bool) -> Operand:
    """``out`` with strides given for ``self``'s dims (reduced dims get 0), resized if needed."""
    shape = out_shape(self, dims, keepdim)
    if list(out.shape) != shape:
        out.resize_(shape)
    if keepdim:
        strides = tuple(0 if d in dims else s for d, s in enumerate(out.stride()))
    else:
        it = iter(out.stride())
        strides = tuple(0 if d in dims else next(it) for d in range(self.dim()))
    return Operand(_buffers[out.untyped_storage().data_ptr()], out.storage_offset(), strides,
                   kernel_dtype(out))


def reduce(op: str, self: torch.Tensor, dim: DimArg, keepdim: bool, out: torch.Tensor,
           out2: torch.Tensor | None = None, p0: float = 0.0) -> torch.Tensor:
    dims = reduced_dims(self, dim)
    o1 = aligned(out, self, dims, keepdim)
    o2 = aligned(out2, self, dims, keepdim) if out2 is not None else None
    state.get().reduce(op, tuple(self.shape), operand(self), set(dims), o1, o2, p0, defer=True)
    return out


def _nonempty(self: torch.Tensor, dim: DimArg, name: str) -> None:
    """torch's errors for an extreme (or its index) of no elements: over all dims (``dim`` None or
    empty) a RuntimeError (an IndexError for argmax/argmin), over an empty dim an IndexError."""
    if self.numel():
        return
    if dim is None or (not isinstance(dim, int) and not len(dim)):
        if name in ("argmax", "argmin"):
            raise IndexError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0.")
        raise RuntimeError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                           f"Specify the reduction dim with the 'dim' argument.")
    for d in reduced_dims(self, dim):
        if self.shape[d] == 0:
            raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")


def _new(self: torch.Tensor, dims: Sequence[int], keepdim: bool, dtype: torch.dtype | None = None) -> torch.Tensor:
    return memory.empty_contiguous(out_shape(self, dims, keepdim), self.dtype if dtype is None else dtype)


# -- functional fast paths ------------------------------------------------------------------------------
# ``x.sum()`` and ``x.mean(dim)`` reach the backend as themselves: sum/mean of everything are composite
# (they call the dim form), and the dim forms are structured, so torch's wrapper would infer the output,
# allocate it by a second call into Python and call our ``.out`` kernel. A float32 call whose dims are
# plain (distinct, in range; none or [] for all) has a signature (the op, the input's shape, strides and
# offset, the dims as given, keepdim) that fixes the output's geometry and the launch but its buffers: the
# launch is built once (Reduce.prepare) and each call allocates the output, binds the two buffers and
# defers it, the launch of the ``.out`` route bit for bit. The table lives on the State's Reduce (a new
# State has its own) and is bounded (MAX_CALLS). Every other call takes torch's route, reached by
# redispatching to a key without kernels of its own (its composite kernels).
MAX_CALLS = 1024
_FLOAT32 = torch.float32
_DL_FLOAT32 = memory.DLPACK[_FLOAT32]
_MISSING = object()


class _Call:
    """A pre-built reduction call: the output's geometry and the launch (None where it cannot be pre-built:
    then the call launches as the ``.out`` route does, a dry run's stand-in kernels say)."""

    __slots__ = ("dims", "keepdim", "nbytes", "op", "prepared", "shape", "strides")

    def __init__(self, op: str, self_: torch.Tensor, dims: list[int], keepdim: bool) -> None:
        self.op, self.dims, self.keepdim = op, dims, keepdim
        self.shape = tuple(out_shape(self_, dims, keepdim))
        self.strides = tuple(memory.contiguous_strides(self.shape))
        self.nbytes = 4 * math.prod(self.shape)
        if keepdim:
            aligned_strides = tuple(0 if d in dims else s for d, s in enumerate(self.strides))
        else:
            it = iter(self.strides)
            aligned_strides = tuple(0 if d in dims else next(it) for d in range(self_.dim()))
        self.prepared = state.get().reduce.prepare(
            op, tuple(self_.shape), Operand(None, self_.storage_offset(), self_.stride(), "float32"), set(dims),
            Operand(None, 0, aligned_strides, "float32"))


def _plain_dims(self: torch.Tensor, dim: DimArg) -> list[int] | None:
    """The reduced dims when ``dim`` names them plainly (None or [] for all; distinct and in range), else
    None (torch's route raises what it must)."""
    nd = self.dim()
    if dim is None or (not isinstance(dim, int) and not len(dim)):
        return list(range(nd))
    dims = [dim] if isinstance(dim, int) else list(dim)
    if any(not isinstance(d, int) or not -nd <= d < nd for d in dims):
        return None
    wrapped = sorted({d % nd for d in dims})
    return wrapped if len(wrapped) == len(dims) else None


def _fast_reduction(op: str, overload: torch._ops.OpOverload) -> Callable[..., torch.Tensor]:
    def kernel(self: torch.Tensor, dim: DimArg = None, keepdim: bool = False, *,
               dtype: torch.dtype | None = None) -> torch.Tensor:
        if self.dtype is _FLOAT32 and (dtype is None or dtype is _FLOAT32) and self.dim() and self.numel():
            calls = state.get().reduce.calls
            key = (op, self.shape, self.stride(), self.storage_offset(),
                   dim if dim is None or isinstance(dim, int) else tuple(dim), keepdim)
            call = calls.get(key, calls)
            if call is calls:   # (calls itself: not seen yet)
                dims = _plain_dims(self, dim)
                call = None if dims is None else _Call(op, self, dims, keepdim)
                if len(calls) >= MAX_CALLS:   # a safety valve for ever-changing signatures
                    calls.clear()
                calls[key] = call
            if call is not None:
                buffer = _buffers.get(self.untyped_storage().data_ptr(), _MISSING)
                if buffer is not _MISSING:
                    out = memory.empty_sized(call.shape, call.strides, _DL_FLOAT32, call.nbytes)
                    if call.prepared is None:
                        return reduce(call.op, self, call.dims, call.keepdim, out)
                    call.prepared.enqueue(_buffers[out.untyped_storage().data_ptr()], buffer)
                    return out
        if overload._schema.arguments[1].name == "dim":
            return overload.redispatch(COMPOSITE_KEYS, self, dim, keepdim, dtype=dtype)
        return overload.redispatch(COMPOSITE_KEYS, self, dtype=dtype)
    return kernel


# -- adapters ----------------------------------------------------------------------------------------
def sum_out(self: torch.Tensor, dim: DimArg, keepdim: bool = False, *, dtype: torch.dtype | None = None,
            out: torch.Tensor) -> torch.Tensor:
    return reduce("sum", self, dim, keepdim, out)


def mean_out(self: torch.Tensor, dim: DimArg, keepdim: bool = False, *, dtype: torch.dtype | None = None,
             out: torch.Tensor) -> torch.Tensor:
    return reduce("mean", self, dim, keepdim, out)


def extreme_out(op: str) -> Callable[..., torch.Tensor]:
    def kernel(self: torch.Tensor, dim: Sequence[int] = (), keepdim: bool = False, *,
               out: torch.Tensor) -> torch.Tensor:
        _nonempty(self, dim, op)
        return reduce(op, self, dim, keepdim, out)
    return kernel


def arg_out(op: str) -> Callable[..., torch.Tensor]:
    def kernel(self: torch.Tensor, dim: int | None = None, keepdim: bool = False, *,
               out: torch.Tensor) -> torch.Tensor:
        _nonempty(self, dim, op)
        return reduce(op, self, dim, keepdim, out)
    return kernel


def full_extreme(op: str, name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    def kernel(self: torch.Tensor) -> torch.Tensor:
        if self.numel() == 0:
            raise RuntimeError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                               f"Specify the reduction dim with the 'dim' argument.")
        return reduce(op, self, None, False, memory.empty_contiguous([], self.dtype))
    return kernel


def dim_values_indices(op: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """``max.dim_max`` / ``min.dim_min``: values and indices (the schema names them oddly)."""
    def kernel(self: torch.Tensor, dim: int, keepdim: bool = False, **outs: torch.Tensor):
        values, indices = outs.values()
        _nonempty(self, dim, "max" if op == "argmax" else "min")
        reduce(op, self, dim, keepdim, values, indices)
        return values, indices
    return kernel


def _correction(correction: float | None) -> float:
    return 1.0 if correction is None else float(correction)


def variance(op: str, with_mean: bool = False) -> Callable[..., Any]:
    def kernel(self: torch.Tensor, dim: DimArg = None, *, correction: float | None = None,
               keepdim: bool = False, out: torch.Tensor | None = None) -> Any:
        dims = reduced_dims(self, dim)
        result = _new(self, dims, keepdim) if out is None else out
        mean = _new(self, dims, keepdim) if with_mean else None
        reduce(op, self, dim, keepdim, result, mean, _correction(correction))
        return (result, mean) if with_mean else result
    return kernel


def vector_norm_out(self: torch.Tensor, ord: float = 2, dim: DimArg = None, keepdim: bool = False, *,
                    dtype: torch.dtype | None = None, out: torch.Tensor) -> torch.Tensor:
    if ord == 2:
        return reduce("norm2", self, dim, keepdim, out)
    if ord == 1:
        return reduce("norm1", self, dim, keepdim, out)
    if ord == math.inf:
        return reduce("norm_inf", self, dim, keepdim, out)
    if ord in (0, -math.inf) or ord < 0:
        raise Unsupported(f"vector norm of order {ord}")
    return reduce("norm_p", self, dim, keepdim, out, p0=float(ord))


def norm_out(self: torch.Tensor, p: float | None, dim: DimArg, keepdim: bool = False, *,
             dtype: torch.dtype | None = None, out: torch.Tensor) -> torch.Tensor:
    """``torch.norm`` over dims (``F.pairwise_distance``, the triplet losses): the vector norm of order p
    (2 when None)."""
    return vector_norm_out(self, 2.0 if p is None else p, dim, keepdim, dtype=dtype, out=out)


def count_nonzero(self: torch.Tensor, dim: Sequence[int]) -> torch.Tensor:
    return torch.ne(self, 0).sum(list(dim))


def aminmax_out(self: torch.Tensor, *, dim: int | None = None, keepdim: bool = False, min: torch.Tensor,
                max: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    torch.ops.aten.aminmax.default(torch.empty(self.shape, dtype=self.dtype, device="meta"), dim=dim,
                                   keepdim=keepdim)   # torch's checks and errors
    if dim is None and keepdim:
        ones = [1] * self.dim()
        reduce("amin", self, None, False, min.resize_(())), reduce("amax", self, None, False, max.resize_(()))
        return min.resize_(ones), max.resize_(ones)
    return reduce("amin", self, dim, keepdim, min), reduce("amax", self, dim, keepdim, max)


def nansum_out(self: torch.Tensor, dim: DimArg = None, keepdim: bool = False, *, dtype: torch.dtype | None = None,
               out: torch.Tensor) -> torch.Tensor:
    values = torch.where(torch.isnan(self), 0, self) if self.dtype.is_floating_point else self
    return torch.sum(values, dim if dim else None, keepdim, dtype=dtype, out=out)


def nansum(self: torch.Tensor, dim: DimArg = None, keepdim: bool = False, *,
           dtype: torch.dtype | None = None) -> torch.Tensor:
    values = torch.where(torch.isnan(self), 0, self) if self.dtype.is_floating_point else self
    return torch.sum(values, dim if dim else None, keepdim, dtype=dtype)


def trace(self: torch.Tensor) -> torch.Tensor:
    if self.dim() != 2:
        raise RuntimeError(f"trace: expected a matrix, but got tensor with dim {self.dim()}")
    diagonal = self.diagonal()
    return diagonal.sum() if self.dtype.is_floating_point else diagonal.sum(dtype=torch.int64)


def prod_out(self: torch.Tensor, dim: int, keepdim: bool = False, *, dtype: torch.dtype | None = None,
             out: torch.Tensor) -> torch.Tensor:
    return reduce("prod", self, dim, keepdim, out)


# -- softmax -----------------------------------------------------------------------------------------
def _rows(t: torch.Tensor, dim: int) -> tuple[int, int, int]:
    if t.dim() == 0:
        return 1, 1, 1
    dim %= t.dim()
    return math.prod(t.shape[:dim]), t.shape[dim], math.prod(t.shape[dim + 1:])


def softmax_out(op: str) -> Callable[..., torch.Tensor]:
    def kernel(self: torch.Tensor, dim: int, half_to_float: bool, *, out: torch.Tensor) -> torch.Tensor:
        # float16 (with half_to_float: autocast's float32 result from float16 input) runs the float32
        # kernel on a converted copy; a float16 result is rounded once
        if half_to_float and self.dtype != torch.float16:
            raise Unsupported(f"half_to_float softmax of a {self.dtype} input")
        x = half.to_float32(self)
        outer, size, inner = _rows(x, dim)
        target = half.float32_target(out, x.shape)
        state.get().softmax(op, outer, size, inner, operand(target), operand(x))
        return half.write_back(out, target)
    return kernel


def softmax_backward_out(op: str) -> Callable[..., torch.Tensor]:
    def kernel(grad_output: torch.Tensor, output: torch.Tensor, dim: int, input_dtype: torch.dtype,
               **out: torch.Tensor) -> torch.Tensor:
        (grad_input,) = out.values()
        g, y = half.to_float32(grad_output), half.to_float32(output)
        outer, size, inner = _rows(g, dim)
        target = half.float32_target(grad_input, g.shape)
        state.get().softmax(op, outer, size, inner, operand(target), operand(g), operand(y))
        return half.write_back(grad_input, target)
    return kernel


def logical(op: str) -> dict[str, Callable[..., torch.Tensor]]:
    """``any``/``all`` over everything, one dim, or a list of dims."""
    return {
        f"{op}.all_out": lambda self, *, out: reduce(op, self, None, False, out),
        f"{op}.out": lambda self, dim, keepdim=False, *, out: reduce(op, self, dim, keepdim, out),
        f"{op}.dims_out": lambda self, dim=None, keepdim=False, *, out: reduce(op, self, dim, keepdim, out),
    }


KERNELS: dict[str, Callable[..., Any]] = {
    "sum": _fast_reduction("sum", torch.ops.aten.sum.default),
    "sum.dim_IntList": _fast_reduction("sum", torch.ops.aten.sum.dim_IntList),
    "mean": _fast_reduction("mean", torch.ops.aten.mean.default),
    "mean.dim": _fast_reduction("mean", torch.ops.aten.mean.dim),
    **logical("any"),
    **logical("all"),
    "sum.IntList_out": sum_out,
    "mean.out": mean_out,
    "prod.int_out": prod_out,
    "amax.out": extreme_out("amax"),
    "amin.out": extreme_out("amin"),
    "argmax.out": arg_out("argmax"),
    "argmin.out": arg_out("argmin"),
    "max": full_extreme("amax", "max"),
    "min": full_extreme("amin", "min"),
    "max.dim_max": dim_values_indices("argmax"),
    "min.dim_min": dim_values_indices("argmin"),
    "var.correction": variance("var"),
    "var.correction_out": variance("var"),
    "std.correction": variance("std"),
    "std.correction_out": variance("std"),
    "var_mean.correction": variance("var", with_mean=True),
    "std_mean.correction": variance("std", with_mean=True),
    "linalg_vector_norm.out": vector_norm_out,
    "norm.out": norm_out,
    "norm.dtype_out": norm_out,
    "count_nonzero.dim_IntList": count_nonzero,
    "aminmax.out": aminmax_out,
    "nansum": nansum,
    "nansum.out": nansum_out,
    "trace": trace,
    "_softmax.out": softmax_out("softmax"),
    "_log_softmax.out": softmax_out("log_softmax"),
    "_softmax_backward_data.out": softmax_backward_out("softmax_backward"),
    "_log_softmax_backward_data.out": softmax_backward_out("log_softmax_backward"),
}
